"""Type stubs of the extension module ``kvdrain._kvdrain`` (hand-written; a test keeps
them in agreement with the module)."""

from collections.abc import Iterable, Mapping
from typing import Literal, final

DecisionKind = Literal["completed", "failed", "expired", "aborted", "released"]
EdgeStateName = Literal[
    "planned",
    "posted",
    "landed",
    "failed_posted",
    "failed_unposted",
    "unknown",
    "noticed",
    "unreachable",
]

EdgeHow = Literal["landed", "failure_notice", "gone", "fenced", "outstanding"]
FailureCauseName = Literal["failure_notice", "gone", "fenced", "aborted", "expired"]

__version__: str
TABLE_SIZES: list[int]
MAX_EDGES: int

@final
class Decision:
    @property
    def kind(self) -> DecisionKind: ...
    @property
    def request_id(self) -> str: ...
    @property
    def blocks(self) -> object: ...
    @property
    def at_ms(self) -> int: ...
    @property
    def forced(self) -> bool: ...
    @property
    def outstanding(self) -> int | list[str] | None: ...
    @property
    def record(self) -> Record:
        """What the ledger knew of the request when this decision was taken (a new object
        at each read; every decision has one)."""

@final
class Record:
    """What the ledger knows of one request (``Decision.record``). Times are the ledger's
    clock in ms, ``None`` where unset."""

    @property
    def request_id(self) -> str: ...
    @property
    def registered_ms(self) -> int: ...
    @property
    def deadline_ms(self) -> int: ...
    @property
    def counting(self) -> bool: ...
    @property
    def expected(self) -> int: ...
    @property
    def owed(self) -> int: ...
    @property
    def edges(self) -> list[tuple[str, EdgeHow, int | None]]:
        """Named edges in registration order: ``(agent, how, at_ms)``, ``how`` the cause the
        core recorded as the edge resolved; empty when counting. ``at_ms`` is the request's
        time for that cause when the edge is its only one with it, else ``None``."""
    @property
    def failure_notice_ms(self) -> int | None: ...
    @property
    def gone_ms(self) -> int | None: ...
    @property
    def fenced_ms(self) -> int | None: ...
    @property
    def ended(self) -> Literal["aborted", "expired"] | None: ...
    @property
    def ended_ms(self) -> int | None: ...
    @property
    def decided_ms(self) -> int | None: ...
    @property
    def settle_end_ms(self) -> int | None: ...
    @property
    def released_ms(self) -> int | None: ...
    @property
    def forced(self) -> bool: ...
    @property
    def first_failure(self) -> FailureCauseName | None: ...
    @property
    def first_failure_ms(self) -> int | None: ...

@final
class Ledger:
    """The consumer (decode-side) ledger. ``feed`` belongs to the thread that drains NIXL,
    every other method to the engine thread; the two may run at once. No Python code runs
    while the ledger holds a lock: the ``blocks`` and ids it lets go are dropped after its
    locks are released, so their finalizers may call back into it or take locks other
    threads hold while calling it."""

    def __init__(
        self,
        capacity: int = 4096,
        *,
        deadline_ms: int = 30000,
        quarantine_ms: int = 60000,
        settle_ms: int = 5000,
        seed: int | None = None,
    ) -> None:
        """Raises ConfigError for a setting out of range (capacity outside
        1..=65536, a negative or too large time or seed) and AllocError (a MemoryError)
        when the ledger's memory cannot be had."""
    @property
    def capacity(self) -> int: ...
    @property
    def table_size(self) -> int: ...
    @property
    def max_edges(self) -> int: ...
    @property
    def deadline_ms(self) -> int: ...
    @property
    def quarantine_ms(self) -> int: ...
    @property
    def settle_ms(self) -> int: ...
    @property
    def now_ms(self) -> int: ...
    @property
    def next_timer_ms(self) -> int | None: ...
    def __len__(self) -> int: ...
    def register(
        self,
        request_id: str,
        blocks: object,
        expect: int | Iterable[str],
        *,
        deadline_ms: int | None = None,
    ) -> None:
        """Raises FullError, DuplicateRequestError, InvalidExpectError (also for
        ``expect=True`` and names that are not valid UTF-8), InvalidRequestIdError (an id
        that can never complete, or not valid UTF-8) or InvalidArgumentError (deadline out
        of range); a refused registration changes nothing and uses up no agent number."""
    def register_many(
        self,
        request_ids: Iterable[str],
        blocks: Iterable[object],
        expect: int | Iterable[str],
        *,
        deadline_ms: int | None = None,
    ) -> None:
        """Registers in order; on the first refusal (or an id that can never complete)
        it raises as ``register`` does: the requests before it stay registered."""
    def feed(
        self, notifs: Mapping[str, Iterable[bytes]], now_ms: int | None = None
    ) -> list[tuple[str, bytes]]:
        """Feeds one NIXL batch; returns the producer-bound messages. Message content never
        raises; only ``bytes`` are messages (a ``bytes``, ``bytearray``, ``memoryview`` or
        ``str`` value is one message). If reading the batch raises, what was read before
        is fed and that exception propagates with ``kvdrain_producer_bound`` set. The batch
        is read in chunks of 65 536 messages; a chunk of 512 or more is fed to the core
        with the GIL released.

        ``now_ms``: when the batch arrived, on the clock ``advance`` is given. Its failure
        notices are dated at the later of ``now_ms`` and the clock (and of any later
        ``now_ms`` an earlier ``feed`` gave), so they settle from their arrival, not from
        the last ``advance``. Without it, they are dated at the later of the clock and the
        last ``now_ms`` given, if any. InvalidArgumentError for one outside 0..2**64."""
    def poll(self) -> list[Decision]:
        """Decisions the fed notices made ready, after any that the clock move of an
        ``abort(..., now_ms=...)`` took."""
    def poll_split(self) -> tuple[list[str], list[Decision]]: ...
    def advance(self, now_ms: int) -> list[Decision]:
        """Raises ClockBackwardsError for an earlier time, InvalidArgumentError for one
        outside 0..2**64."""
    def hold_refused(self, request_id: str, blocks: object) -> int:
        """Holds the blocks of a receive this ledger refused that producers may write into
        all the same (another rank's registration let them): the hold ends
        ``quarantine_ms`` after the clock, rounded up to a 61st of it (at least 1 ms).
        Returns that end (ms); ``poll_refused_releases`` hands the receive back once an
        ``advance`` reaches it. Changes no tracked request; never refuses."""
    def poll_refused_releases(self) -> list[tuple[str, object]]:
        """The refused holds the clock has ended, oldest first, as ``(request_id,
        blocks)``, each handed back once: its blocks are free."""
    def abort(self, request_id: str, *, now_ms: int | None = None) -> Decision | None:
        """``now_ms``: ``advance(now_ms)`` first (same errors), so the abort and its
        quarantine are dated then; the decisions that move takes stay queued: the next
        ``poll`` (or ``advance``, ``gone``, ``fence``) returns them first."""
    def fence(self, agent: str, *, now_ms: int | None = None) -> list[Decision]:
        """``now_ms``: ``advance(now_ms)`` first (same errors); its decisions come first."""
    def gone(self, agent: str, *, now_ms: int | None = None) -> list[Decision]:
        """``now_ms``: ``advance(now_ms)`` first (same errors), so the blocks settle from
        then; its decisions come first."""
    def counters(self) -> dict[str, int]: ...

@final
class PushPlan:
    def __init__(
        self,
        request_id: str,
        *,
        p_tp: int,
        d_tp: int,
        d_agents: list[str | None],
        tp_rank: int,
        p_pp: int = 1,
        pp_stage: int = 0,
        mla: bool = False,
    ) -> None:
        """Raises InvalidRequestIdError for an id that can never complete and
        TopologyError for sizes or ranks out of range; a ``d_rank`` out of range given to
        a method raises PlanError."""
    @property
    def targets(self) -> list[int]: ...
    @property
    def edges(self) -> list[tuple[int, EdgeStateName]]: ...
    def may_post(self, d_rank: int) -> bool: ...
    def posted(self, d_rank: int) -> None: ...
    def post_failed(self, d_rank: int) -> None: ...
    def landed(self, d_rank: int) -> None: ...
    def backend_error(self, d_rank: int) -> None: ...
    def failed(self, d_rank: int) -> None: ...
    def status_unknown(self, d_rank: int) -> None: ...
    def landed_after_unknown(self, d_rank: int) -> None: ...
    def unreachable(self, d_rank: int) -> None: ...
    def retire(self) -> None: ...
    def owed_notices(self) -> list[tuple[str, bytes]]: ...
    def take_owed_notices(self) -> list[tuple[str, bytes]]: ...
    def noticed(self, d_rank: int) -> None: ...
    @property
    def is_terminal(self) -> bool: ...
    @property
    def all_landed(self) -> bool: ...

def producers_of(
    d_rank: int, *, p_tp: int, d_tp: int, p_pp: int = 1, mla: bool = False
) -> list[tuple[int, int]]:
    """The ``(pp_stage, tp_rank)`` producer ranks whose WRITEs land on consumer rank
    ``d_rank``, in order (the core's ``Topology::producers_of``). Raises TopologyError for
    sizes out of range, a larger TP size that is not a multiple of the smaller, or a
    ``d_rank`` outside ``0..d_tp``."""

def encode_cancel(request_id: str) -> bytes:
    """``PUSH_CANCEL:{request_id}``: what a consumer sends each producer it registered
    ``request_id`` with once it gives the request up. Raises InvalidRequestIdError for an
    empty id."""

def parse_cancel(message: object) -> str | None:
    """The request id a ``PUSH_CANCEL:`` message names; ``None`` for anything else
    (another message, malformed bytes, not ``bytes``). Never raises."""
