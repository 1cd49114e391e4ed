"""The slots of each experiment: which queued trial takes a free one, on which platform, and
its request on the DISPATCH stream.

An experiment holds at most ``trialConcurrency`` trials dispatched and not ended (they hold
its slots); the others wait in its queue, in submission order. A trial taking a slot is
marked dispatched in the cache first, then its request goes out (``send``), and until the
stream acknowledged it the trial is *unsent*: the sweep sends it again, and the dedupe id
(``<trial>:<attempt>``) makes a second copy a no-op. A hybrid experiment's trial goes to the
platform :class:`~services.dispatcher.placement.Placement` chooses, and comes back to the
queue when that platform goes down before starting it (``take_back``). A retry (the trial's
next attempt, :mod:`.retries`) waits out its back-off in ``later``, then goes first in the queue.

Every method costs O(1) per trial it moves, except ``take_back`` (O(trialConcurrency)), ``due``
(O(retries waiting in the experiment)) and, on a platform teams share, the turn a trial waits for
(O(experiments waiting there + teams), :mod:`.shares`; never the queued trials): a queue is a
:class:`TrialQueue`, where taking a trial out of the middle (a cancel before dispatch) or asking
whether one is there is O(1) too, however many trials wait (an experiment may queue 100,000).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator
from datetime import datetime

from contracts import subjects
from contracts.messages import CancelRequest
from contracts.people import ADMIN_TEAM
from contracts.state import ExperimentState, ExperimentStatus, TrialState, TrialStatus
from services.common.bus import Bus
from services.dispatcher.placement import Placement
from services.dispatcher.requests import trial_request
from services.dispatcher.settings import DispatcherSettings
from services.dispatcher.shares import Demand, Holding, Shares
from services.dispatcher.store import StateStore

log = logging.getLogger(__name__)


class TrialQueue:
    """Trial ids waiting for a slot, in order: appending at either end, taking the first,
    removing any, and membership all O(1) (an ordered dict's; a deque's are O(n))."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()

    def append(self, trial_id: str) -> None:
        self._ids[trial_id] = None

    def appendleft(self, trial_id: str) -> None:
        self._ids[trial_id] = None
        self._ids.move_to_end(trial_id, last=False)

    def popleft(self) -> str:
        return self._ids.popitem(last=False)[0]

    def remove(self, trial_id: str) -> None:
        del self._ids[trial_id]

    def first(self) -> str:
        return next(iter(self._ids))

    def __contains__(self, trial_id: object) -> bool:
        return trial_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)


class Slots:
    """Queues, slots and requests of every experiment (the module's docstring)."""

    def __init__(self, settings: DispatcherSettings, bus: Bus, store: StateStore) -> None:
        self.settings = settings
        self.bus = bus
        self.store = store
        #: experiment → trial ids WAITING for a slot, in submission order
        self.queue: dict[str, TrialQueue] = defaultdict(TrialQueue)
        #: experiment → retries waiting for their back-off → when they may be queued again
        self.later: dict[str, dict[str, datetime]] = defaultdict(dict)
        #: experiment → trial ids dispatched and not ended (they hold the slots)
        self.active: dict[str, set[str]] = defaultdict(set)
        #: trials marked dispatched whose request is not (known to be) on the stream yet
        self.unsent: set[str] = set()
        #: trial → sequence of its request in DISPATCH, so it can be withdrawn unclaimed
        self.seq: dict[str, int] = {}
        #: the platforms' capacity, and the choice of platform in hybrid experiments
        self.placement = Placement(settings.platform_stale_after)
        #: who runs next where teams share a platform, and what to preempt (:mod:`.shares`)
        self.shares = Shares(wants=self.wants)
        #: pools where capacity freed since :meth:`take_freed`: their waiting experiments may go
        self.freed: set[str] = set()
        self.wake = asyncio.Event()
        #: an experiment began waiting on a shared platform: the sweep's preemptions may be due now
        self.arrival = asyncio.Event()

    def load(self, trial: TrialState) -> None:
        """A trial of the state loaded at start: queued, or holding its slot (and sent again
        while WAITING: a crash may have come between the KV write and the publish)."""
        if trial.status.terminal:
            return
        if trial.dispatched:
            self.active[trial.experiment_id].add(trial.id)
            self.placement.occupy(trial.experiment_id, trial.platform)
            if state := self.store.experiments.get(trial.experiment_id):
                self._hold(state, trial.id, trial.platform)
            if trial.status == TrialStatus.WAITING:
                self.unsent.add(trial.id)
        elif trial.retry_at is not None:
            self.later[trial.experiment_id][trial.id] = trial.retry_at
        else:
            self.queue[trial.experiment_id].append(trial.id)

    def enqueue(self, trial: TrialState) -> None:
        self.queue[trial.experiment_id].append(trial.id)

    def again(self, trial: TrialState) -> None:
        """A trial's next attempt: first in the queue, once its ``retry_at`` (if any) has come."""
        if trial.retry_at is None:
            self.queue[trial.experiment_id].appendleft(trial.id)
        else:
            self.later[trial.experiment_id][trial.id] = trial.retry_at

    def due(self, experiment_id: str, now: datetime) -> None:
        """Queue (first) the retries of the experiment whose back-off is over."""
        later = self.later.get(experiment_id)
        if not later:
            return
        for trial_id in [t for t, when in later.items() if when <= now]:
            del later[trial_id]
            self.queue[experiment_id].appendleft(trial_id)

    def free(self, trial: TrialState) -> None:
        """The trial ended: its slot (or its place in the queue) is free."""
        if trial.id in self.active[trial.experiment_id]:
            self.active[trial.experiment_id].discard(trial.id)
            self.placement.release(trial.experiment_id, trial.platform)
            if (holding := self.shares.release(trial.id)) is not None:
                self.freed.add(holding.pool)
                self.wake.set()
        if trial.id in self.queue[trial.experiment_id]:
            self.queue[trial.experiment_id].remove(trial.id)
        self.later[trial.experiment_id].pop(trial.id, None)
        self.seq.pop(trial.id, None)
        self.unsent.discard(trial.id)

    def forget(self, experiment_id: str, trials: Iterable[TrialState]) -> None:
        """The experiment is deleted (its ``trials`` have ended): nothing of it is held."""
        for trial in trials:
            self.free(trial)
        for table in (self.queue, self.later, self.active):
            table.pop(experiment_id, None)
        self.shares.done(experiment_id)

    def wants(self, experiment_id: str) -> int:
        """Trials the experiment could start now: its queue, up to its free slots (0 unless RUNNING). O(1)."""
        state = self.store.experiments.get(experiment_id)
        queue = self.queue.get(experiment_id)
        if state is None or state.status != ExperimentStatus.RUNNING or not queue:
            return 0
        return max(0, min(len(queue), state.config.trial_concurrency - len(self.active.get(experiment_id, ()))))

    def explained(self, trial: TrialState) -> TrialState:
        """The queued trial, saying why its experiment's queue does not move when its first trial
        says so (only the first trial's message is kept up to date: one write, however long the
        queue). O(1)."""
        queue = self.queue.get(trial.experiment_id)
        if trial.status != TrialStatus.WAITING or trial.dispatched or not queue or trial.id not in queue:
            return trial
        head = self.store.trials.get(queue.first())
        if head is None or head.id == trial.id or not head.message or head.message == trial.message:
            return trial
        return trial.model_copy(update={"message": f"queued behind trial {head.id}, which is {head.message}"})

    def take_freed(self) -> set[str]:
        """The pools where capacity freed since the last call (their waiting experiments may go)."""
        freed, self.freed = self.freed, set()
        self.wake.clear()
        return freed

    async def withdraw(self, trial: TrialState) -> bool:
        """Delete the trial's request from the stream; True when it was still there (no replica had
        acknowledged it: unclaimed, or held by one waiting for capacity, which a cancel then reaches)."""
        seq = self.seq.get(trial.id)
        if seq is None:
            return False
        try:
            return await self.bus.js.delete_msg("DISPATCH", seq)
        except Exception:
            return False

    async def dispatch_ready(self, experiment_id: str) -> None:
        """Dispatch queued trials while the experiment has free slots."""
        await asyncio.gather(*(self.send(trial) for trial in self.take_ready(experiment_id)))

    def take_ready(self, experiment_id: str) -> list[TrialState]:
        """Move queued trials into free slots (in the cache); the caller sends them.

        A hybrid experiment's trial goes to the platform :class:`.Placement` chooses; while
        none is up with room, the queue waits (its head says why) and the sweep tries again. On a
        platform teams share, the trial takes capacity only when :class:`.Shares` says it is its
        turn; otherwise the head says why it waits.
        """
        state = self.store.experiments[experiment_id]
        config = state.config
        queue, active = self.queue[experiment_id], self.active[experiment_id]
        taken = []
        while queue and len(active) < config.trial_concurrency and state.status == ExperimentStatus.RUNNING:
            head = self.store.trials[queue.first()]
            adapter, why = self._platform(state, len(active))
            if adapter is None:
                if head.message != why:
                    self.store.defer(head.model_copy(update={"message": why}))
                break
            queue.popleft()
            trial = head.model_copy(
                update={
                    "dispatched": True,
                    "platform": adapter,
                    "message": f"dispatched to {adapter}; waiting for an adapter replica to start it",
                }
            )
            self.store.defer(trial)
            active.add(trial.id)
            self.placement.occupy(experiment_id, adapter)
            self._hold(state, trial.id, adapter)
            self.unsent.add(trial.id)
            taken.append(trial)
        if not self.wants(experiment_id):
            self.shares.done(experiment_id)
        return taken

    def _platform(self, state: ExperimentState, active: int) -> tuple[str | None, str]:
        """Where the experiment's next trial goes now, or None and why it waits. A hybrid experiment
        refused by the teams' shares on one platform tries its others with room; refused everywhere,
        it waits (and may preempt) on the first that refused only. O(platforms × the shares' cost)."""
        config = state.config
        if not config.hybrid:
            why = self.turn(state, config.adapter, active)
            return (config.adapter, "") if why is None else (None, why)
        refused: dict[str, str] = {}
        while (adapter := self.placement.choose(state.id, config, skip=refused)) is not None:
            why = self.turn(state, adapter, active)
            if why is None:
                break
            refused[adapter] = why
        waits_in = None if adapter is not None else next(iter(refused), None)
        for other in refused:
            if other != waits_in:
                self.shares.withdraw(self.placement.pool_of(config, other), state.id)
        if adapter is not None:
            return adapter, ""
        return None, refused[waits_in] if waits_in is not None else self.placement.why_waiting(config)

    def turn(self, state: ExperimentState, adapter: str, active: int) -> str | None:
        """None when the experiment's next trial may take capacity on ``adapter`` now, else why it waits."""
        demand = Demand(
            experiment=state.id,
            team=state.team or ADMIN_TEAM,
            priority=state.config.priority,
            started=state.start_time.timestamp(),
            gpus=self.placement.gpus_of(state.config, adapter),
            want=max(1, min(len(self.queue[state.id]), state.config.trial_concurrency - active)),
        )
        pool = self.placement.pool_of(state.config, adapter)
        why = self.shares.admit(pool, demand, self.placement.capacity(pool))
        if self.shares.arrived:
            self.shares.arrived = False
            self.arrival.set()
        return why

    def _hold(self, state: ExperimentState, trial_id: str, adapter: str) -> None:
        holding = Holding(
            pool=self.placement.pool_of(state.config, adapter),
            team=state.team or ADMIN_TEAM,
            experiment=state.id,
            gpus=self.placement.gpus_of(state.config, adapter),
            priority=state.config.priority,
        )
        self.shares.hold(trial_id, holding)

    async def take_back(self, state: ExperimentState) -> None:
        """Take back a hybrid experiment's trials sent to a platform that went down before
        starting them, and queue them first again, for another platform. O(trialConcurrency).

        Only a request withdrawn from the stream is taken back (unclaimed, or held by a replica
        waiting for capacity); that replica is told to drop it (a cancel, which ends every attempt
        it holds of the trial). The trial goes out again as its next attempt, so anything the old
        one still says is ignored (``on_event`` reads only the current attempt).
        """
        config = state.config
        down = {s.adapter for s in config.training_services if not self.placement.up(s, config)}
        if not down:
            return
        back = []
        for trial_id in list(self.active[state.id]):
            trial = self.store.trials[trial_id]
            if trial.status != TrialStatus.WAITING or trial.platform not in down or trial.cancel_status:
                continue
            if not await self.withdraw(trial):
                continue
            message = f"taken back from {trial.platform}, which went down before starting it"
            cancel = CancelRequest(
                experiment_id=state.id, trial_id=trial_id, status=TrialStatus.SYS_CANCELED, message=message
            )
            await self.bus.nc.publish(subjects.control(trial.platform, "cancel"), cancel.encode())
            self.active[state.id].discard(trial_id)
            self.placement.release(state.id, trial.platform)
            self.shares.release(trial_id)
            self.seq.pop(trial_id, None)
            back.append(
                trial.model_copy(
                    update={"dispatched": False, "platform": "", "attempt": trial.attempt + 1, "message": message}
                )
            )
            log.info("trial %s: %s", trial_id, message)
        for trial in reversed(back):
            self.store.defer(trial)
            self.queue[state.id].appendleft(trial.id)
        if back:
            await self.store.flush([t.id for t in back])

    async def send(self, trial: TrialState) -> None:
        """Persist a dispatched trial and publish its request (concurrently; see :meth:`load`)."""
        if self.store.trials[trial.id].status.terminal:  # ended (canceled) before it went out
            self.unsent.discard(trial.id)
            return
        state = self.store.experiments[trial.experiment_id]
        request = trial_request(state, trial, self.settings.trial_secret.get_secret_value())
        publish = self.bus.js.publish(
            subjects.dispatch(trial.platform),
            request.encode(),
            headers={"Nats-Msg-Id": subjects.dispatch_id(trial.id, trial.attempt)},
        )
        try:  # the cache holds the trial as dispatched (``take_ready``), maybe changed since
            _, ack = await asyncio.gather(self.store.flush([trial.id]), publish)
        except Exception as exc:  # the broker is away: the sweep sends it again
            log.warning("dispatching trial %s failed (%s); will retry", trial.id, exc)
            return
        self.seq[trial.id] = ack.seq
        self.unsent.discard(trial.id)
