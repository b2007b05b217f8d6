"""The target's KV cache: one preallocated buffer per device, a length per row.

Every row of a batch (a *slot*: the request decoding there) owns one row of each
device's buffer ``[layers on the device, 2 (keys, values), slots, kv heads,
capacity, head dim]``. A forward writes its block at each row's own length
(``rows 0..n`` of the forward are slots ``lo..lo + n``), and attention reads
every row up to the longest one plus the block: what lies past a row's own
length is hidden by the mask the core builds. Nothing is appended: a step
writes in place, and the buffer grows by doubling when a block would not fit.
Entries are zeroed before any forward first reads that far (a masked score
still multiplies its value, and memory never written could hold a NaN that no
mask hides); the buffer itself is allocated without touching its pages.

After acceptance, :meth:`RowCache.commit` keeps each row's root and accepted
guesses: one gather and one scatter per device for every row and every layer,
then the rows' lengths move on. Rejected and auxiliary entries are left behind
the new lengths, to be overwritten by the next block.

A finished row's slot is refilled by a prefill into it (:meth:`RowCache.clear`,
then a forward on that slot alone); :meth:`RowCache.move` packs the live rows
to the front when no request is left to refill a slot, so a forward always
runs on a contiguous range of slots.
"""

from __future__ import annotations

import weakref

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class _RowLayer(CacheLayerMixin):
    """One model layer's view of the shared buffers (what the model's attention calls)."""

    is_sliding = False  # every layer keeps every position: a sliding window is applied in the mask
    is_croppable = False

    def __init__(self, cache: RowCache, index: int) -> None:  # no super().__init__: keys/values are views
        # a weak reference: no cycle, so a cache ends (and its buffer is free again) as its last user drops it
        self.cache, self.index, self.is_initialized = weakref.proxy(cache), index, True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return self.cache._write(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length()

    def get_max_length(self) -> int:
        return -1

    def _view(self, which: int) -> torch.Tensor:
        cache = self.cache
        device, j = cache._where[self.index]
        lo, hi = cache.rows
        return cache.stores[device][j, which, lo:hi, :, : cache.get_seq_length()]

    @property
    def keys(self) -> torch.Tensor:
        """The active rows' keys up to the longest row: ``[rows, kv heads, length, head dim]``."""
        return self._view(0)

    @property
    def values(self) -> torch.Tensor:
        return self._view(1)


class RowCache(Cache):
    """KV entries of ``slots`` rows for a model whose layers run on ``layer_devices`` (one per layer)."""

    def __init__(self, slots: int, layer_devices: list[torch.device | None], limit: int | None = None) -> None:
        if slots < 1:
            raise ValueError(f"a cache needs at least one slot, got {slots}")
        self.slots = slots
        self.lengths = [0] * slots  # committed entries per slot
        self.limit = limit  # most entries a row will ever need (the buffer never doubles past it)
        self._where: list[tuple[torch.device | None, int]] = []
        per_device: dict[torch.device, int] = {}
        for device in layer_devices:
            if device is None:  # a layer that never runs (a self-draft's skipped layer): no room kept for it
                self._where.append((None, -1))
                continue
            device = torch.device(device)
            self._where.append((device, per_device.get(device, 0)))
            per_device[device] = per_device.get(device, 0) + 1
        self._count = per_device
        self.stores: dict[torch.device, torch.Tensor] = {}
        self.capacity = 0
        self.touched = 0  # entries [0, touched) of every row are finite: zeroed, or written since
        self.rows = (0, slots)  # the slots of the forward running now (and of get_seq_length)
        self._block = 0
        self._offsets: list[int] | None = None
        self._index: dict[torch.device, torch.Tensor] = {}
        super().__init__(layers=[_RowLayer(self, i) for i in range(len(self._where))])

    # -- the forward ------------------------------------------------------------------------------------

    def begin(self, lo: int, hi: int, block: int) -> None:
        """A forward of ``block`` tokens per row on slots ``lo..hi`` is about to run."""
        if not 0 <= lo < hi <= self.slots:
            raise ValueError(f"slots {lo}..{hi} outside the cache's {self.slots}")
        self.rows, self._block, self._index = (lo, hi), block, {}
        lengths = self.lengths[lo:hi]
        self._offsets = None if len(set(lengths)) == 1 else lengths
        span = max(lengths) + block
        self.reserve(span)
        self.touch(span)

    def touch(self, span: int) -> None:
        """Entries up to ``span`` finite in every row: what a forward reads for the first time is zeroed,
        256 entries at once."""
        if span > self.touched:
            reach = min(self.capacity, max(span, self.touched + 256))
            for store in self.stores.values():
                store[..., self.touched : reach, :].zero_()
            self.touched = reach

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The longest committed row among the active slots."""
        lo, hi = self.rows
        return max(self.lengths[lo:hi])

    def reserve(self, need: int) -> None:
        """Room for ``need`` entries per row: the buffers double (up to :attr:`limit`) when they are short."""
        if need <= self.capacity:
            return
        grown = max(need, min(2 * self.capacity, self.limit or 2 * self.capacity), 64)
        for device, store in self.stores.items():
            bigger = store.new_empty((*store.shape[:4], grown, store.shape[5]))
            bigger[..., : self.touched, :] = store[..., : self.touched, :]
            self.stores[device] = bigger
        self.capacity = grown

    def add_slot(self) -> int:
        """One more (empty) slot; returns its index."""
        for device, store in self.stores.items():
            bigger = store.new_empty((store.shape[0], 2, self.slots + 1, *store.shape[3:]))
            bigger[:, :, : self.slots] = store
            bigger[:, :, self.slots, :, : self.touched].zero_()
            self.stores[device] = bigger
        self.lengths.append(0)
        self.slots += 1
        return self.slots - 1

    def _write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device, j = self._where[layer]
        if device is None:
            raise ValueError(f"layer {layer} was left out of this cache")
        store = self.stores.get(device)
        if store is None:
            store = self._allocate(device, keys)
        elif store.shape[3] != keys.shape[1] or store.shape[5] != keys.shape[3]:
            raise ValueError(f"layer {layer}'s keys {tuple(keys.shape)} differ in shape from the other layers' on "
                             f"{device}: this model's cache layout is not supported")
        lo, hi = self.rows
        rows = store[j, :, lo:hi]  # [2, n, heads, capacity, dim]
        q = keys.shape[2]
        if self._offsets is None:  # every row at the same length: a slice
            at = self.lengths[lo]
            rows[0, :, :, at : at + q] = keys
            rows[1, :, :, at : at + q] = values
        else:
            index = self._index.get(device)
            if index is None:  # each row's own positions, uploaded once per device and forward
                base = torch.tensor(self._offsets)[:, None] + torch.arange(q)[None]
                index = self._index[device] = upload(base, device)[:, None, :, None]
            where = index.expand_as(keys)
            rows[0].scatter_(2, where, keys)
            rows[1].scatter_(2, where, values)
        span = max(self.lengths[lo:hi]) + q
        return rows[0, :, :, :span], rows[1, :, :, :span]

    def allocate(self, heads: int, dim: int, dtype: torch.dtype, capacity: int) -> None:
        """Every device's buffer now, at ``capacity`` entries a row: it is never regrown, so its address holds
        for the cache's life (the static shapes of ``forward=compiled``). Its entries are zeroed as forwards
        first read them, as a grown buffer's are."""
        for device, count in self._count.items():
            self.stores[device] = torch.empty((count, 2, self.slots, heads, capacity, dim), dtype=dtype,
                                              device=device)
        self.capacity, self.touched, self.limit = capacity, 0, capacity

    def adopt(self, store: torch.Tensor) -> None:
        """An earlier cache's buffer (one device, the same slots) as this cache's own: its address kept, its
        entries zeroed again as forwards first read them."""
        (device,) = self._count
        self.stores = {device: store}
        self.capacity = self.limit = store.shape[4]
        self.touched = 0

    def _allocate(self, device: torch.device, keys: torch.Tensor) -> torch.Tensor:
        _, heads, _, dim = keys.shape
        store = torch.empty((self._count[device], 2, self.slots, heads, self.capacity, dim),
                            dtype=keys.dtype, device=keys.device)
        store[..., : self.touched, :].zero_()
        self.stores[device] = store
        return store

    # -- between forwards -------------------------------------------------------------------------------

    def commit(self, lo: int, keeps: list[list[int]]) -> None:
        """Row ``r`` (slot ``lo + r``) keeps the entries ``keeps[r]`` of its last block (ascending, 0 first:
        the root), moved to follow its committed entries; its length grows by ``len(keeps[r])``."""
        moved = [k for k in keeps if k != list(range(len(k)))]
        if moved:
            width = max(len(k) for k in keeps)
            src, dst = [], []
            for r, keep in enumerate(keeps):
                at = self.lengths[lo + r]
                dst.append([at + i for i in range(width)])
                src.append([at + k for k in keep] + dst[-1][len(keep):])  # padding copies an entry onto itself
            both = torch.tensor([src, dst])
            n = len(keeps)
            for device, store in self.stores.items():
                index = upload(both, device)
                live = store[:, :, lo : lo + n]
                shape = (*live.shape[:4], width, live.shape[5])
                take, put = (i[None, None, :, None, :, None].expand(shape) for i in index)
                live.scatter_(4, put, live.gather(4, take))
        for r, keep in enumerate(keeps):
            self.lengths[lo + r] += len(keep)

    def clear(self, slot: int) -> None:
        """Empty ``slot`` for a new request (its entries are overwritten by the next prefill)."""
        self.lengths[slot] = 0

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s entries into slot ``dst`` (packing live rows to the front)."""
        n = self.lengths[src]
        for store in self.stores.values():
            store[:, :, dst, :, :n] = store[:, :, src, :, :n]
        self.lengths[dst], self.lengths[src] = n, 0

    def crop(self, max_length: int) -> None:
        """Every active row keeps its first ``max_length`` entries (negative: drops that many of its own)."""
        lo, hi = self.rows
        for slot in range(lo, hi):
            n = self.lengths[slot]
            self.lengths[slot] = max(0, min(n, max_length if max_length >= 0 else n + max_length))


def upload(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host values (a list, an array or a CPU tensor) as a tensor on ``device``; on CUDA through pinned memory,
    asynchronously (a plain ``torch.tensor(..., device=cuda)`` copies from pageable memory and waits for the
    device)."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
