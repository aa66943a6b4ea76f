"""MFU's inputs (issue 46): the model FLOPs a rank computed in its step, how they were known, and the
precision its matrix math ran in. The agent sets the peak they are taken against.

The FLOPs of a step, first of these that applies:

- declared: the program's own count, lockstep.step(flops=N);
- tokens: 6 x the model's trainable parameters x the step's tokens (forward 2, backward 4 per
  parameter and token: the usual definition for language models), when the step reports tokens;
- layers: counted on the model's nn.Linear and nn.Conv1d/2d/3d leaves by forward hooks, during the
  forwards that train (module.training, autograd on), x 3 for the backward; summed over the step's
  micro-batches. Python ints from shapes: no tensor op, no wait for the GPU. Once a step gives
  flops= or tokens, the hooks are removed for good.

The precision: what watch(precision=) says, else autocast's dtype when the model's forward runs
under autocast, else the dtype of the model's first floating parameter (float32 on a GPU: tf32
when torch lets matmuls use it).

Imports nothing of the package's: _api imports it.
"""

import math
import numbers
import sys
import warnings

DECLARED, TOKENS, LAYERS = 1, 2, 3  # lockstep.proto's FlopsBasis
PRECISIONS = {"fp32": 1, "tf32": 2, "bf16": 3, "fp16": 4, "fp8": 5}  # lockstep.proto's Precision
FP32, TF32, BF16, FP16, FP8 = 1, 2, 3, 4, 5
MAX_FLOPS = 1e17 * 604800  # a week at 100 PFLOP/s: what the agent takes (protocol/src/validate.cpp)


def checked_precision(precision):
    """watch(precision=)'s value as lockstep.proto's Precision, None when not given."""
    if precision is None:
        return None
    key = precision.lower() if isinstance(precision, str) else precision
    if key not in PRECISIONS:
        raise ValueError("lockstep.watch(precision=%r): give one of %s, or leave it out to have it detected"
                         % (precision, ", ".join('"%s"' % p for p in PRECISIONS)))
    return PRECISIONS[key]


def declared(flops):
    """step(flops=)'s value, checked: a finite, non-negative number of FLOPs."""
    if isinstance(flops, bool) or not isinstance(flops, numbers.Real):
        raise ValueError("flops is %r, not a number (this rank's model FLOPs in the step)" % (flops,))
    value = float(flops)
    if not math.isfinite(value) or value < 0:
        raise ValueError("flops is %r, not a finite number >= 0" % (flops,))
    if value > MAX_FLOPS:
        raise ValueError("flops is %.3g, over %.3g (a week at 100 PFLOP/s): a unit mistaken?" % (value, MAX_FLOPS))
    return value


def _flat_numel(p):
    """An FSDP1 FlatParameter's unsharded trainable numel (its original parameters, without
    padding); None when p is not one."""
    numels = getattr(p, "_numels", None)
    if numels is None:
        size = getattr(p, "_unpadded_unsharded_size", None)
        if size is None:
            return None
        return int(math.prod(size)) if p.requires_grad else 0
    originals = getattr(p, "_params", None)  # use_orig_params=True: each may be frozen on its own
    if originals is not None and len(originals) == len(numels):
        return sum(int(n) for q, n in zip(originals, numels) if q.requires_grad)
    return sum(int(n) for n in numels) if p.requires_grad else 0


def parameter_count(module):
    """(the whole model's trainable parameters, counted once each, None) or (None, why not).
    DDP: the wrapped module's. FSDP1: its flat parameters' unsharded sizes. FSDP2 and other
    DTensors: their global sizes. DeepSpeed ZeRO-3: ds_numel."""
    root = module.module if hasattr(module, "require_backward_grad_sync") and hasattr(module, "module") else module
    total, counted, sharded = 0, set(), False
    for m in root.modules():
        if type(m).__name__ != "FullyShardedDataParallel":
            continue
        sharded = True
        handles = list(getattr(m, "_handles", None) or ())  # torch 1.13
        if getattr(m, "_handle", None) is not None:          # torch 2.x
            handles.append(m._handle)
        for handle in handles:
            flat = getattr(handle, "flat_param", None)
            if flat is None or id(flat) in counted:
                continue
            n = _flat_numel(flat)
            if n is None:
                return None, "this torch's FSDP flat parameters say nothing of their unsharded sizes"
            total += n
            counted.add(id(flat))
            for q in list(getattr(flat, "_params", None) or ()) + list(getattr(flat, "_shared_params", None) or ()):
                counted.add(id(q))  # use_orig_params=True: views of the local shard, counted above
    for p in root.parameters():  # each once: a shared (tied) weight is one parameter
        if id(p) in counted:
            continue
        counted.add(id(p))
        n = _flat_numel(p)
        if n is None:
            if not p.requires_grad:
                continue
            n = getattr(p, "ds_numel", None)
            if n is None:
                if sharded:
                    return None, ("FSDP's parameters are shards here and their full sizes are not found "
                                  "(use_orig_params with this torch?)")
                n = p.numel()  # a DTensor's (FSDP2, tensor parallel) is its global one
        total += int(n)
    return total, None


class _Hooks:
    """The layer counters' forward hooks; their sum since the last step()."""

    def __init__(self, torch, module):
        nn = torch.nn
        self.flops = 0
        self.handles = []
        grad_enabled = torch.is_grad_enabled
        for m in module.modules():
            if next(iter(m.children()), None) is not None:
                continue  # a leaf's only: a container's own hook would count its layers twice
            if isinstance(m, nn.Linear) and m.in_features > 0:
                per_row, rows_of = 2 * m.in_features * m.out_features, m.out_features
                hook = self._linear(per_row, rows_of, grad_enabled)
            elif isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and m.in_channels > 0:
                hook = self._conv(2 * (m.in_channels // m.groups) * math.prod(m.kernel_size), grad_enabled)
            else:
                continue
            self.handles.append(m.register_forward_hook(hook))

    # 2 x in x out per row: rows from the output's shape (as the input's numel // in_features,
    # and present when the input came as a keyword).
    def _linear(self, per_row, out_features, grad_enabled):
        def hook(module, inputs, output):
            if module.training and grad_enabled():
                self.flops += per_row * (output.numel() // out_features)
        return hook

    # 2 x (in_channels / groups) x the kernel's size, per output element.
    def _conv(self, per_output, grad_enabled):
        def hook(module, inputs, output):
            if module.training and grad_enabled():
                self.flops += per_output * output.numel()
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _autocast_dtype(torch, device_type):
    """autocast's dtype for `device_type` when it is on now, else None (torch 1.13 and 2.x)."""
    if hasattr(torch, "get_autocast_dtype"):  # torch 2.4 on
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return None


class Counter:
    """One watched model's FLOPs and precision, step by step."""

    def __init__(self, module, precision=None):
        import torch

        self._torch = torch
        self._module = module
        self.precision = precision  # what watch() was told, else detected
        self._parameters = None     # (count, why not), once a step needs it
        self._warned = False
        self._first = next((p for p in module.parameters() if p.is_floating_point()), None)
        self._device_type = self._first.device.type if self._first is not None else "cpu"
        self._autocast = None       # the dtype autocast ran the step's forwards in, else None
        self._hooks = _Hooks(torch, module)
        if not self._hooks.handles:
            self._hooks = None
        self._pre_hook = module.register_forward_pre_hook(self._before_forward) if precision is None else None

    def _before_forward(self, module, inputs):
        if self._torch.is_grad_enabled():
            self._autocast = _autocast_dtype(self._torch, self._device_type)

    def _detected_precision(self):
        torch, dtype = self._torch, self._autocast
        if dtype is None:
            if self._first is None:
                return None
            dtype = self._first.dtype
        if dtype == torch.bfloat16:
            return BF16
        if dtype == torch.float16:
            return FP16
        if str(dtype).startswith("torch.float8"):
            return FP8
        if dtype != torch.float32:
            return None  # float64: no peak of its own here
        if self._device_type != "cuda":
            return FP32
        with warnings.catch_warnings():  # newer torch may say allow_tf32 is deprecated
            warnings.simplefilter("ignore")
            try:
                tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
            except Exception:  # a torch that refuses the old switch once the new one was set
                tf32 = torch.get_float32_matmul_precision() != "highest"
        return TF32 if tf32 else FP32

    def _parameter_count(self):
        if self._parameters is None:
            try:
                self._parameters = parameter_count(self._module)
            except Exception as e:  # best effort: a wrapper this does not know
                self._parameters = (None, "%s: %s" % (type(e).__name__, e))
        count, why = self._parameters
        if count is None and not self._warned:
            self._warned = True
            print("lockstep: not reporting flops from tokens: the model's parameters are not known (%s); give "
                  "lockstep.step(flops=...)" % why, file=sys.stderr, flush=True)
        return count

    def skip_step(self):
        """A step that is not reported: the next one's layers start from none."""
        if self._hooks is not None:
            self._hooks.flops = 0

    def close_step(self, fields, tokens):
        """Adds the step's flops, basis and precision to `fields` (flops when the program gave
        none); the layer count starts over."""
        precision = self.precision if self.precision is not None else self._detected_precision()
        if precision is not None:
            fields["precision"] = precision
        hooks = self._hooks
        if "flops" in fields or tokens is not None:
            if hooks is not None:  # counted on the program's terms from now on: the hooks go
                hooks.remove()
                self._hooks = None
            if "flops" in fields or not tokens:
                return
            count = self._parameter_count()
            if count is not None and 6.0 * count * tokens <= MAX_FLOPS:
                fields["flops"] = 6.0 * count * tokens
                fields["flops_basis"] = TOKENS
            return
        if hooks is not None:
            flops, hooks.flops = hooks.flops, 0
            if flops > 0 and flops * 3 <= MAX_FLOPS:
                fields["flops"] = float(flops * 3)
                fields["flops_basis"] = LAYERS
