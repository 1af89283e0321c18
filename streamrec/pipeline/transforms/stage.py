"""The machinery every transform shares (:class:`Stage`): reading its source through the
:class:`~streamrec.pipeline.transforms.chain.Source` protocol, being a source itself, iteration on
both paths, exact consumption counting and the state.

A stage's ``_pieces(chunks)`` turns its source's chunks into pieces (see
:mod:`streamrec.pipeline.transforms.ledger`). ``record_chunks`` hands each piece's items on and
keeps a :class:`~streamrec.pipeline.transforms.ledger.Ledger` of them; ``mark_consumed(n)`` from the
consumer goes through the ledger to the source's ``mark_consumed``. Iterating a stage directly
(``for``/``async for``) is the same with a :class:`~streamrec.pipeline.transforms.ledger.Handout` as
the consumer, so there is one way consumption is counted.

A stateless stage (parse, batch, map, filter) has the state of its source: the source's
position already says what was consumed. A stage with a position of its own (take, skip,
repeat, unbatch) wraps it: ``{"<key>": {...its counters...}, "source": <source state>}``;
its counters apply to the iteration that continues the loaded epoch (``set_epoch`` to another
epoch starts afresh). The blocking path reports consumption from the consumer's thread while
the background loop waits, never while it advances the source.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from streamrec._portal import owned, owning
from streamrec.errors import ExampleError, StateError
from streamrec.pipeline.options import ReadOptions
from streamrec.pipeline.transforms.ledger import (
    ItemPiece,
    Ledger,
    handed_out_async,
    handed_out_blocking,
)

if TYPE_CHECKING:
    from streamrec.pipeline.stats import Stats

__all__ = ["Chunks", "Stage", "check_count", "non_negative_int", "root_of"]

T = TypeVar("T")
#: What a transform reads from its source: its items, a chunk (a list) at a time.
Chunks = AsyncGenerator[list[Any], None]


class Stage(Generic[T]):
    """A transform of a source: iteration, the source protocol, forwarding, the state."""

    #: the key of the stage's own counters in its state (None: the source's state as it is)
    state_key: str | None = None

    def __init__(self, source: Any) -> None:
        self.source = source
        """The link below this one (a Dataset, a mix or another transform)."""
        self._ledger: Ledger | None = None  # the current (or last) iteration's
        self._report: Any = None  # the consumer's report_consumed hook
        self._handed: Any = None  # the consumer's handed_out hook
        self._resume: dict[str, int] | None = None  # own counters loaded, for the next iteration
        self._resume_epoch: int | None = None
        self._base: dict[str, int] = {}  # own counters the current iteration started from

    # ---------------------------------------------------------------- for subclasses

    def _pieces(self, chunks: Chunks) -> AsyncGenerator[ItemPiece, None]:
        """The pieces made from the source's ``chunks``; closes ``chunks`` however it ends."""
        raise NotImplementedError

    def _initial(self) -> dict[str, int]:
        """Own counters at the start of an epoch (stages with a ``state_key``)."""
        return {}

    def _counters(self, ledger: Ledger) -> dict[str, int]:
        """Own counters now, from the iteration's ledger and ``self._base``."""
        return {}

    def _check(self, counters: dict[str, Any]) -> dict[str, int]:
        """Own counters of a loaded state, checked (StateError naming the field)."""
        return {}

    # ---------------------------------------------------------------- the source protocol

    async def record_chunks(
        self,
        *,
        auto_consume: bool = True,
        report_consumed: Any = None,
        handed_out: Any = None,
    ) -> AsyncGenerator[list[T], None]:
        """This stage's items in chunks (see
        :class:`~streamrec.pipeline.transforms.chain.Source`)."""
        self._base = self._start()
        ledger = self._ledger = Ledger(self._base.get("in_batch", 0))
        self._report = None if auto_consume else report_consumed
        self._handed = None if auto_consume else handed_out
        async with owning(self._pieces(self._open_source())) as pieces:
            async for items, sizes, skipped in pieces:
                consumed = ledger.add(len(items), sizes, skipped)
                if auto_consume:
                    consumed += ledger.consume(len(items))
                if consumed:
                    self._mark_source(consumed)
                if items:
                    yield items

    #: whether the stage decodes its source's chunks whole (a parse): a dataset source may
    #: then leave records in place (``record_chunks(in_place=True)``: chunks that are
    #: ``Sequence[bytes]``, not lists)
    takes_records_in_place = False

    def _open_source(self) -> AsyncGenerator[list[Any], None]:
        source = self.source
        place = {}
        # (a Dataset: the one source read with ReadOptions)
        if self.takes_records_in_place and isinstance(getattr(source, "options", 0), ReadOptions):
            place = {"in_place": True}
        if not hasattr(source, "mark_consumed"):  # iteration works; state_dict() is refused
            return cast(AsyncGenerator[list[Any], None], owned(source.record_chunks(**place)))
        return cast(
            AsyncGenerator[list[Any], None],
            owned(
                source.record_chunks(
                    auto_consume=False,
                    report_consumed=self._report_down,
                    handed_out=self._peek,
                    **place,
                )
            ),
        )

    def _placed(self, error: ExampleError, payload: object) -> ExampleError:
        """``error`` (decoding ``payload``, a record of the source not consumed yet) naming
        the record's shard, index and offset where the chain's root knows them."""
        locate = getattr(root_of(self), "locate", None)
        where = None if locate is None else locate(payload)
        return error if where is None else error.located(*where)

    def _mark_source(self, n: int) -> None:
        mark = getattr(self.source, "mark_consumed", None)
        if mark is not None:
            mark(n)

    def mark_consumed(self, n: int) -> None:
        """``n`` more items from ``record_chunks(auto_consume=False)`` reached the consumer."""
        if self._ledger is None:  # a consumer of an iteration that load_state_dict() or
            return  # set_epoch() replaced: nothing of the new position to count
        consumed = self._ledger.consume(n)
        if consumed:
            self._mark_source(consumed)

    def _report_down(self) -> None:
        if self._report is not None:
            self._report()

    def _peek(self) -> int:
        """Source records the consumer has taken so far (no side effect: for ``stats``)."""
        ledger = self._ledger
        if ledger is None:
            return 0
        if self._handed is None:
            return ledger.upstream
        return ledger.upstream + ledger.peek(self._handed() - ledger.items)

    # ---------------------------------------------------------------- iteration

    def __aiter__(self) -> AsyncGenerator[T, None]:
        return handed_out_async(self)

    def __iter__(self) -> Iterator[T]:
        return handed_out_blocking(self)

    # ---------------------------------------------------------------- forwarded

    def __len__(self) -> int:
        """Items this consumer gets in one epoch: as many as the source has (a TypeError
        where that is unknown)."""
        return len(self.source)

    @property
    def dataset(self) -> Any:
        """The root of the chain (the :class:`~streamrec.Dataset`, or a mix)."""
        return root_of(self)

    @property
    def epoch(self) -> int:
        """The source's epoch."""
        return cast(int, self.source.epoch)

    @property
    def stats(self) -> Stats:
        """The source's counters (``records``: records handed to the consumer)."""
        return cast("Stats", self.source.stats)

    def _live_stats(self) -> Stats:
        """The root's live counters, which a transform adds its own time to (a mix's
        ``stats`` is a sum made when asked: adding to it would be lost)."""
        root = root_of(self)
        return cast("Stats", getattr(root, "own_stats", None) or root.stats)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the source; another epoch than the current one starts at its
        beginning (own counters too)."""
        if epoch != getattr(self.source, "epoch", None):
            self._resume = None
            self._ledger = None
            self._report = self._handed = None
            self._base = {}
        self.source.set_epoch(epoch)

    def _start(self) -> dict[str, int]:
        """Own counters the new iteration starts from: a loaded state's (same epoch), else
        the epoch's start."""
        resume, self._resume = self._resume, None
        if resume is not None and self._resume_epoch == getattr(self.source, "epoch", None):
            return resume
        return self._initial()

    def _own(self) -> dict[str, int]:
        if self._resume is not None:
            return dict(self._resume)
        if self._ledger is None:
            return self._initial()
        return self._counters(self._ledger)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last item handed out: the source's state, with this
        stage's counters if it has any (see the module documentation).

        Raises :class:`NotImplementedError` if the source cannot count consumption through
        a transform (no ``mark_consumed``).
        """
        source = self.source
        if not hasattr(source, "mark_consumed") or not hasattr(source, "state_dict"):
            raise NotImplementedError(
                f"{type(source).__name__} has no mark_consumed()/state_dict(): the position "
                "after a transform cannot be saved"
            )
        self._report_down()
        if self.state_key is None:
            return cast(dict[str, Any], source.state_dict())
        own = self._own()
        return {self.state_key: own, "source": source.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) on the next iteration."""
        load = getattr(self.source, "load_state_dict", None)
        if load is None:
            raise NotImplementedError(f"{type(self.source).__name__} has no load_state_dict()")
        self._report = self._handed = None
        self._ledger = None
        if self.state_key is None:
            load(state)
            return
        key = self.state_key
        if not isinstance(state, dict) or set(state) != {key, "source"}:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise StateError(
                f"not a state of {type(self).__name__}: expected the keys {key!r} and "
                f"'source', got {got}"
            )
        counters = state[key]
        if not isinstance(counters, dict):
            raise StateError(f"{key}: expected an object, got {type(counters).__name__}")
        own = self._check(counters)
        load(state["source"])
        self._resume = own
        self._resume_epoch = getattr(self.source, "epoch", None)

    def __getstate__(self) -> dict[str, Any]:
        # pickled (DataLoader workers under spawn, copies mid-iteration): the position
        # after the last item handed out; the iteration in progress stays here
        state = self.__dict__.copy()
        if self._ledger is not None:
            self._report_down()
            if self.state_key is not None:
                state["_resume"] = self._own()
                state["_resume_epoch"] = getattr(self.source, "epoch", None)
        state["_ledger"] = state["_report"] = state["_handed"] = None
        return state


def root_of(link: Any) -> Any:
    """The root of a chain: the first link that is not a :class:`Stage`."""
    while isinstance(link, Stage):
        link = link.source
    return link


def non_negative_int(value: Any, what: str) -> int:
    """``value``, an argument of a transform, checked: a non-negative int (ValueError naming
    ``what`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, not {value!r}")
    return value


def check_count(counters: dict[str, Any], name: str, key: str, most: int | None) -> int:
    """``counters[name]``: an int in ``[0, most]`` (StateError naming ``key.name``)."""
    value = counters.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StateError(f"{key}.{name}: expected a non-negative int, got {value!r}")
    if most is not None and value > most:
        raise StateError(f"{key}.{name}: {value} is more than {most}")
    return value
