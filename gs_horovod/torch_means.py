"""The end of an early dense step in torch (:meth:`EngineState.dense_ahead`): Horovod's
optimizer and the DDP hook allreduce each gradient in float16 as backward produces it, and
:class:`DenseMeans` casts each merged mean into its place in one f32 buffer whose views are
the step's updates, so the step costs what ``Compression.fp16``'s decompress does plus one
finiteness check over the buffer."""

from __future__ import annotations

import torch

from .engine.state import EngineState


class DenseMeans:
    """One early step's means: ``buffer`` (D + dense,) f32 laid out by
    :meth:`EngineState.mean_layout`; ``places`` its (d,) view per tensor name; ``outs`` the
    tensors handed out so far, each to hold its update once :meth:`put` has every mean."""

    def __init__(self, state: EngineState, device: torch.device) -> None:
        total, places = state.mean_layout()
        self.state = state
        self.buffer = torch.empty(total, dtype=torch.float32, device=device)
        self.places = {name: self.buffer[o:o + d] for name, (o, d) in places.items()}
        self.outs: dict[str, torch.Tensor] = {}

    def put(self, name: str, mean: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """Casts ``mean`` (d,) (float16, the ranks' merged mean of ``name``'s gradient) into its
        place and returns the tensor of ``shape`` and ``dtype`` that holds its update after the
        last put: the place itself for float32, else a new tensor. The last put runs the step
        (:meth:`EngineState.take_means`); a skipped step's zero update is copied into every
        tensor handed out."""
        place = self.places[name]
        place.copy_(mean)
        self.outs[name] = out = place.view(shape) if dtype == torch.float32 else place.new_empty(shape, dtype=dtype)
        if len(self.outs) == len(self.places):
            for n, update in self.state.take_means(self.buffer).items():
                if self.outs[n].data_ptr() != update.data_ptr():
                    self.outs[n].view(-1).copy_(update)
        return out
