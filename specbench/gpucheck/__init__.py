"""The lent-GPU check (``specbench gpu-check``, ``bash gpu_check.sh`` on a machine without network): the GPU
paths checked on random-weight models of the papers' shapes, nothing downloaded.

What it checks, stage by stage (:mod:`.stages` plans them against a deadline): a tree's logits against each
branch alone, the cache after compaction, every method's greedy output against autoregressive decoding's, fp16
and bf16 fixed points, ``device_map`` placements, sampling at T = 1, ``budget=auto`` and the 70B placement plan
(:mod:`.check`, :mod:`.scenarios`, on the models :mod:`.models` builds); the cost curve and the speed table
(:mod:`.speed`), host syncs per step against each method's ceiling (:mod:`.syncs`), and ``forward=compiled``'s
CUDA graphs against eager decoding (:mod:`.forward`). Every function takes the device, so the test suite runs the
same code on the CPU with tiny shapes. Jobs themselves run in :mod:`specbench.run`.
"""
