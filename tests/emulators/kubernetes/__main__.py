"""``python -m tests.emulators.kubernetes [--port P] [--state DIR] [options]``: run the emulator.

It prints the kubeconfig to use (and writes it with ``--kubeconfig PATH``), then serves until
Ctrl-C, which kills every pod process and removes the mount links it made. Example:

    python -m tests.emulators.kubernetes --port 8080 --token secret \\
        --volume nfs://10.0.0.1/exports=/tmp/nfs --kubeconfig /tmp/emulator.kubeconfig
    KUBECONFIG=/tmp/emulator.kubeconfig kubectl get frameworks   # or the frameworkcontroller adapter
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from .kubeconfig import kubeconfig_yaml
from .server import Settings, create_app


def _volume(text: str) -> tuple[str, str]:
    key, found, local = text.partition("=")
    if not found or not local or not key.startswith(("nfs://", "azurefile://")):
        raise argparse.ArgumentTypeError(f"expected nfs://SERVER/PATH=DIR or azurefile://SHARE=DIR, got {text!r}")
    return key, local


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.emulators.kubernetes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (0.0.0.0 in a container)")
    p.add_argument("--state", type=Path, help="directory for pod logs and process records (default: a new temp dir)")
    p.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (default: no auth)")
    p.add_argument(
        "--volume",
        type=_volume,
        action="append",
        default=[],
        metavar="nfs://SERVER/PATH=DIR",
        help="serve an nfs or azureFile (azurefile://SHARE=DIR) volume from a local folder (repeatable)",
    )
    p.add_argument(
        "--stuck-image",
        action="append",
        default=[],
        metavar="IMAGE",
        help="pods using this image never start: ImagePullBackOff (repeatable)",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=None,
        metavar="NS",
        help="the namespaces that exist (repeatable; default: any)",
    )
    p.add_argument("--strict", action="store_true", help="reject undeclared Framework fields instead of pruning")
    p.add_argument("--no-crd", action="store_true", help="serve no FrameworkController CRD (a cluster without FC)")
    p.add_argument("--kueue", action="store_true", help="install Kueue: LocalQueues, ClusterQueues, gated pods")
    p.add_argument("--tick", type=float, default=0.05, metavar="SECONDS", help="controller step interval")
    p.add_argument("--history-limit", type=int, default=5000, metavar="N", help="writes a watch can resume across")
    p.add_argument(
        "--kill-grace",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="SIGTERM to SIGKILL when a pod sets no terminationGracePeriodSeconds",
    )
    p.add_argument("--kubeconfig", type=Path, metavar="PATH", help="also write the kubeconfig here")
    p.add_argument("--context-namespace", default="default", metavar="NS", help="the kubeconfig's default namespace")
    p.add_argument("--quiet", action="store_true", help="do not print the kubeconfig")
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    state = (args.state or Path(tempfile.mkdtemp(prefix="k8s-emulator-"))).resolve()
    return Settings(
        state_dir=state,
        token=args.token,
        volumes=dict(args.volume),
        stuck_images=set(args.stuck_image),
        namespaces=set(args.namespace) if args.namespace is not None else None,
        strict=args.strict,
        serve_crd=not args.no_crd,
        kueue=args.kueue,
        tick=args.tick,
        history_limit=args.history_limit,
        kill_grace=args.kill_grace,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = settings_from(args)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    kubeconfig = kubeconfig_yaml(f"http://127.0.0.1:{args.port}", args.token, args.context_namespace)
    if args.kubeconfig:
        args.kubeconfig.write_text(kubeconfig)
        args.kubeconfig.chmod(0o600)
    if not args.quiet:
        print(f"# Kubernetes emulator on http://127.0.0.1:{args.port}, state in {settings.state_dir}")
        print(kubeconfig, end="", flush=True)
    app = create_app(settings)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)
    Server(config, app).run()


class Server(uvicorn.Server):
    """uvicorn, ending the watch streams when asked to exit (it waits for open requests to finish,
    and a watch never does), as an apiserver going down closes them."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = getattr(self.app.state, "loop", None)
        if loop is not None:
            loop.call_soon_threadsafe(self.app.state.store.drop_watches)  # safe from a signal handler
        super().handle_exit(sig, frame)


if __name__ == "__main__":
    main()
