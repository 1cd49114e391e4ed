"""``python -m tests.emulators.openpai --port P --state DIR [options]``: run the emulator.

With ``--tls-cert`` and ``--tls-key`` it serves HTTPS instead of HTTP, as a cluster with a
self-signed certificate does."""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn

from .server import Settings, create_app


def _pair(sep: str):
    def parse(text: str) -> tuple[str, str]:
        key, found, value = text.partition(sep)
        if not found or not key:
            raise argparse.ArgumentTypeError(f"expected KEY{sep}VALUE, got {text!r}")
        return key, value

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.emulators.openpai", description=__doc__)
    p.add_argument("--port", type=int, required=True, help="TCP port")
    p.add_argument("--host", default="127.0.0.1", help="listen address (0.0.0.0 in a container)")
    p.add_argument("--state", type=Path, required=True, help="directory for job logs and process-group records")
    p.add_argument(
        "--user",
        type=_pair(":"),
        action="append",
        default=[],
        metavar="NAME:PASSWORD",
        help="a user (repeatable; default alice:alice-password)",
    )
    p.add_argument("--admin", action="append", default=[], metavar="NAME", help="an admin user (repeatable)")
    p.add_argument(
        "--vc",
        type=_pair(":"),
        action="append",
        default=[],
        metavar="NAME:USER1,USER2",
        help="a virtual cluster and its users (repeatable); 'default' is open to all unless given",
    )
    p.add_argument(
        "--vc-gpus",
        type=_pair("="),
        action="append",
        default=[],
        metavar="NAME=N",
        help="a virtual cluster's GPUs (its resourcesTotal; repeatable; default 0); a new name adds it, open to all",
    )
    p.add_argument(
        "--storage",
        action="append",
        default=None,
        metavar="NAME",
        help="a storage config name (repeatable; default confignfs)",
    )
    p.add_argument("--submit-limit", type=int, default=60, metavar="N", help="job submissions per user per window")
    p.add_argument(
        "--submit-window",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="the window the submission limit counts over (default an hour, as upstream)",
    )
    p.add_argument(
        "--mount",
        type=_pair("="),
        action="append",
        default=[],
        metavar="CONTAINER_PATH=LOCAL_PATH",
        help="make CONTAINER_PATH a symlink to LOCAL_PATH while the emulator runs (repeatable)",
    )
    p.add_argument(
        "--lag",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long a new job stays AttemptCreationPending before its framework is created",
    )
    p.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="serve HTTPS with this certificate (then its chain; needs --tls-key)",
    )
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert (unencrypted)")
    args = p.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        p.error("--tls-cert and --tls-key go together")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    users = dict(args.user) or {"alice": "alice-password"}
    vcs = {name: [u for u in members.split(",") if u] for name, members in args.vc}
    vc_gpus = {name: int(gpus) for name, gpus in args.vc_gpus}
    return Settings(
        state_dir=args.state.resolve(),
        users=users,
        admins=set(args.admin),
        vcs=vcs,
        vc_gpus=vc_gpus,
        storages=args.storage if args.storage is not None else ["confignfs"],
        submit_limit=args.submit_limit,
        submit_window=args.submit_window,
        mounts=dict(args.mount),
        lag=args.lag,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.state.mkdir(parents=True, exist_ok=True)
    tls = {"ssl_certfile": str(args.tls_cert), "ssl_keyfile": str(args.tls_key)} if args.tls_cert else {}
    uvicorn.run(create_app(settings_from(args)), host=args.host, port=args.port, log_level="warning", **tls)


if __name__ == "__main__":
    main()
