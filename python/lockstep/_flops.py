"""MFU's inputs (issue 46): the model FLOPs a rank computed in its step, how they were known, and the
precision its matrix math ran in. The agent sets the peak they are taken against.

The FLOPs of a step, first of these that applies:

- declared: the program's own count, lockstep.step(flops=N);
- tokens: (4 x all the model's parameters + 2 x its trainable ones) x the step's tokens, when the
  step reports tokens: per parameter and token 2 for the forward, 2 for the gradient of its input
  and 2 for its own gradient, which a frozen parameter (LoRA's base model) does not compute; 6 x
  the parameters x the tokens (the usual definition for language models) when all train;
- layers: counted on the model's nn.Linear and nn.Conv1d/2d/3d leaves by forward hooks, during the
  forwards that train (module.training, autograd on), x 3 for the backward; summed over the step's
  micro-batches. Python ints from shapes: no tensor op, no wait for the GPU. Once a step gives
  flops=, or tokens whose count succeeded, the hooks are removed for good.

The precision: what watch(precision=) says, else the dtype of the output of the model's first
counted layer in the latest forward that trained (a light hook that stays: it sees FSDP's
MixedPrecision and autocast, whose parameters stay float32), else autocast's dtype when the model's
forward runs under it, else the dtype of the model's first floating parameter. float32 on a GPU:
tf32 when torch lets matmuls use it.

A hook that fails (a layer whose output is not a tensor) is said once on stderr and the hooks go:
the program never sees an exception of lockstep's. Imports nothing of the package's but _bursts
(its warn): _api imports it.
"""

import math
import numbers
import warnings

from lockstep._bursts import warn

DECLARED, TOKENS, LAYERS = 1, 2, 3  # lockstep.proto's FlopsBasis
PRECISIONS = {"fp32": 1, "tf32": 2, "bf16": 3, "fp16": 4, "fp8": 5}  # lockstep.proto's Precision
FP32, TF32, BF16, FP16, FP8 = 1, 2, 3, 4, 5
MAX_FLOPS = 1e17 * 604800  # a week at 100 PFLOP/s: what the agent takes (protocol/src/validate.cpp)


_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def checked_precision(precision):
    """watch(precision=)'s value as lockstep.proto's Precision, None when not given: a name, or a
    torch dtype (torch.bfloat16, torch.float16, torch.float32, a torch.float8 one)."""
    if precision is None:
        return None
    key = precision.lower() if isinstance(precision, str) else precision
    if type(precision).__module__ == "torch" and type(precision).__name__ == "dtype":
        name = str(precision)
        key = "fp8" if name.startswith("torch.float8") else _DTYPES.get(name, name)
    if not isinstance(key, str) or key not in PRECISIONS:
        raise ValueError("lockstep.watch(precision=%r): give one of %s (or torch.float32, torch.bfloat16, "
                         "torch.float16, a torch.float8 dtype), or leave it out to have it detected"
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
    """An FSDP1 FlatParameter's unsharded numel (its original parameters, without padding) as (all,
    trainable); None when p is not one."""
    numels = getattr(p, "_numels", None)
    if numels is None:
        size = getattr(p, "_unpadded_unsharded_size", None)
        if size is None:
            return None
        n = int(math.prod(size))
        return n, n if p.requires_grad else 0
    n = sum(int(k) for k in numels)
    originals = getattr(p, "_params", None)  # use_orig_params=True: each may be frozen on its own
    if originals is not None and len(originals) == len(numels):
        return n, sum(int(k) for q, k in zip(originals, numels) if q.requires_grad)
    return n, n if p.requires_grad else 0


def parameter_count(module):
    """((all the model's parameters, its trainable ones), counted once each, None) or (None, why
    not). DDP: the wrapped module's. FSDP1: its flat parameters' unsharded sizes. FSDP2 and other
    DTensors: their global sizes. DeepSpeed ZeRO-3: ds_numel."""
    root = module.module if hasattr(module, "require_backward_grad_sync") and hasattr(module, "module") else module
    total, trainable, counted, sharded = 0, 0, set(), False
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
            total, trainable = total + n[0], trainable + n[1]
            counted.add(id(flat))
            for q in list(getattr(flat, "_params", None) or ()) + list(getattr(flat, "_shared_params", None) or ()):
                counted.add(id(q))  # use_orig_params=True: views of the local shard, counted above
    for p in root.parameters():  # each once: a shared (tied) weight is one parameter
        if id(p) in counted:
            continue
        counted.add(id(p))
        n = _flat_numel(p)
        if n is None:
            k = getattr(p, "ds_numel", None)
            if k is None:
                if sharded:
                    return None, ("FSDP's parameters are shards here and their full sizes are not found "
                                  "(use_orig_params with this torch?)")
                k = p.numel()  # a DTensor's (FSDP2, tensor parallel) is its global one
            n = int(k), int(k) if p.requires_grad else 0
        total, trainable = total + n[0], trainable + n[1]
    return (total, trainable), None


def _layers(nn, module):
    """The counted leaves (a container's own hook would count its layers twice): (layer, FLOPs per
    output row, the row's length). Linear: 2 x in x out per row of out; convolution: 2 x
    (in_channels / groups) x the kernel's size per output element."""
    for m in module.modules():
        if next(iter(m.children()), None) is not None:
            continue
        if isinstance(m, nn.Linear) and m.in_features > 0:
            yield m, 2 * m.in_features * m.out_features, m.out_features
        elif isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and m.in_channels > 0:
            yield m, 2 * (m.in_channels // m.groups) * math.prod(m.kernel_size), 1


def _autocast_dtype(torch, device_type):
    """autocast's dtype for `device_type` when it is on now, else None (torch 1.13 and 2.x)."""
    if hasattr(torch, "get_autocast_dtype"):  # torch 2.4 on
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return None


def _tf32_allowed(torch):
    """Whether float32 matmuls on CUDA may run in TF32. Before torch 2.9 a plain read (one switch,
    no warning); from 2.9 the new setting, else the old one with its deprecation warning silenced."""
    new = getattr(torch._C, "_get_fp32_precision_getter", None)
    if new is None:
        get = getattr(torch, "get_float32_matmul_precision", None)
        return get() != "highest" if get is not None else bool(torch.backends.cuda.matmul.allow_tf32)
    for backend, op in (("cuda", "matmul"), ("generic", "all")):
        setting = new(backend, op)
        if setting in ("tf32", "ieee"):
            return setting == "tf32"
    with warnings.catch_warnings():  # "none" both: the old switch says
        warnings.simplefilter("ignore")
        try:
            return bool(torch.backends.cuda.matmul.allow_tf32)
        except Exception:  # a torch that refuses the old switch once the new one was set
            return torch.get_float32_matmul_precision() != "highest"


TF32_EVERY = 100  # steps between two reads of the TF32 setting (cached in between)


class Counter:
    """One watched model's FLOPs and precision, step by step."""

    def __init__(self, module, precision=None):
        import torch

        self._torch = torch
        self._module = module
        self._grad_enabled = torch.is_grad_enabled
        self.precision = precision  # what watch() was told, else detected
        self._parameters = None     # ((all, trainable), why not), once a step needs it
        self._warned = False
        self._first = next((p for p in module.parameters() if p.is_floating_point()), None)
        self._autocast = None       # the dtype autocast ran the step's forwards in, else None
        self._seen = None           # (dtype, on CUDA) of the probe layer's latest training output
        self._tf32 = None           # the TF32 setting, read every TF32_EVERY steps
        self._tf32_age = 0
        self.flops = 0              # the layers' forward FLOPs since the last step()
        self._handles = []          # the counting hooks
        self._probe = None          # the probe's own hook, once the counting ones went
        self._probe_layer = None
        self._hook_failed = False
        for m, per, row in _layers(torch.nn, module):
            probe = self._probe_layer is None and precision is None
            if probe:
                self._probe_layer = m
            self._handles.append(m.register_forward_hook(self._counting(per, row, probe)))
        # autocast, read before each forward until the probe saw a forward (none without a probe)
        self._pre_hook = None
        if precision is None:
            self._pre_hook = module.register_forward_pre_hook(self._before_forward)

    # Each hook's body is wrapped: an error in it is said once and the hooks go (_failed).
    def _counting(self, per_row, row, probe):
        grad_enabled = self._grad_enabled
        if probe:
            def hook(module, inputs, output):
                try:
                    if module.training and grad_enabled():
                        self._seen = output.dtype, output.is_cuda
                        self.flops += per_row * (output.numel() // row)
                except Exception as e:
                    self._failed(e)
        else:
            def hook(module, inputs, output):
                try:
                    if module.training and grad_enabled():
                        self.flops += per_row * (output.numel() // row)
                except Exception as e:
                    self._failed(e)
        return hook

    def _probing(self, module, inputs, output):
        try:
            if module.training and self._grad_enabled():
                self._seen = output.dtype, output.is_cuda
        except Exception as e:
            self._failed(e)

    def _before_forward(self, module, inputs):
        try:
            if self._grad_enabled() and self._first is not None:
                self._autocast = _autocast_dtype(self._torch, self._first.device.type)
        except Exception as e:
            self._failed(e)

    def _failed(self, e):
        """A hook raised: said once, every hook goes (precision from the parameters from now on)."""
        if self._hook_failed:
            return
        self._hook_failed = True
        self._remove_counting()
        for handle in (self._probe, self._pre_hook):
            if handle is not None:
                handle.remove()
        self._probe = self._pre_hook = self._probe_layer = None
        self._seen = self._autocast = None
        warn("not counting flops on the model's layers, nor detecting its precision from them: a hook "
             "failed (%s: %s); give lockstep.step(flops=...) and watch(precision=...)" % (type(e).__name__, e))

    def _remove_counting(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.flops = 0

    def _stop_counting(self):
        """The step's FLOPs come on the program's terms from now on: the counting hooks go, the
        probe stays."""
        if not self._handles:
            return
        self._remove_counting()
        if self._probe_layer is not None:
            self._probe = self._probe_layer.register_forward_hook(self._probing)

    def _detected_precision(self):
        torch = self._torch
        if self._seen is not None:
            dtype, cuda = self._seen
            if self._pre_hook is not None:  # the probe sees autocast's dtype too
                self._pre_hook.remove()
                self._pre_hook = None
        else:
            first = self._first
            if self._autocast is not None:
                dtype = self._autocast
            elif first is not None:
                dtype = first.dtype
            else:
                return None
            cuda = first is not None and first.is_cuda  # read now: a model moved after watch()
        if dtype == torch.bfloat16:
            return BF16
        if dtype == torch.float16:
            return FP16
        if str(dtype).startswith("torch.float8"):
            return FP8
        if dtype != torch.float32:
            return None  # float64: no peak of its own here
        if not cuda:
            return FP32
        if self._tf32 is None or self._tf32_age >= TF32_EVERY:
            self._tf32, self._tf32_age = _tf32_allowed(torch), 0
        self._tf32_age += 1
        return TF32 if self._tf32 else FP32

    def _parameter_count(self):
        if self._parameters is None:
            try:
                self._parameters = parameter_count(self._module)
            except Exception as e:  # best effort: a wrapper this does not know
                self._parameters = (None, "%s: %s" % (type(e).__name__, e))
        count, why = self._parameters
        if count is None and not self._warned:
            self._warned = True
            warn("not reporting flops from tokens: the model's parameters are not known (%s); %sgive "
                 "lockstep.step(flops=...)" % (why, "counting them on its layers instead; " if self._handles else ""))
        return count

    def skip_step(self):
        """A step that is not reported: the next one's layers start from none."""
        self.flops = 0

    def close_step(self, fields, tokens):
        """Adds the step's flops, basis and precision to `fields` (flops when the program gave
        none); the layer count starts over."""
        precision = self.precision if self.precision is not None else self._detected_precision()
        if precision is not None:
            fields["precision"] = precision
        if "flops" in fields:
            self._stop_counting()
            return
        if tokens is not None:
            count = self._parameter_count()
            if count is not None:  # counted on the program's terms from now on
                self._stop_counting()
                flops = (4.0 * count[0] + 2.0 * count[1]) * tokens
                if 0 < flops <= MAX_FLOPS:
                    fields["flops"] = flops
                    fields["flops_basis"] = TOKENS
                return
        flops, self.flops = self.flops, 0
        if flops > 0 and flops * 3 <= MAX_FLOPS:
            fields["flops"] = float(flops * 3)
            fields["flops_basis"] = LAYERS
