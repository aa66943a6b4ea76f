"""Lockstep's start-up hook for the Python ranks an agent starts (docs/own-program.md, "When a job
stops moving").

The agent puts this directory on each rank's PYTHONPATH, after the lockstep package's, so that
Python runs this file at start-up: even a script that never imports lockstep then keeps a progress
record and dumps its stacks when the agent asks. It loads the package's _progress module alone
(importing the package would cost every Python process it starts tens of milliseconds, and move
the start of its first step), and nothing at all outside Lockstep. Then it runs the sitecustomize
this one hides: the next one on sys.path (Debian's, which installs apport's hook), as Python would
have without it.
"""


def _lockstep_module(spec):
    """A module for `spec`, as importlib.util.module_from_spec makes it (importlib.util itself
    would cost every Python process contextlib and collections at start-up)."""
    import types

    module = types.ModuleType(spec.name)
    module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
    module.__package__ = spec.parent
    if spec.cached:
        module.__cached__ = spec.cached
    return module


def _lockstep_install():
    import os
    import sys

    if "LOCKSTEP_PROGRESS" not in os.environ and "LOCKSTEP_STACKS" not in os.environ:
        return
    try:
        progress = sys.modules.get("lockstep._progress")
        if progress is None:
            from importlib.machinery import ModuleSpec, PathFinder, SourceFileLoader

            package = PathFinder.find_spec("lockstep")
            if package is None or not package.submodule_search_locations:
                return
            for directory in package.submodule_search_locations:
                path = os.path.join(directory, "_progress.py")
                if os.path.isfile(path):
                    break
            else:
                return
            spec = ModuleSpec("lockstep._progress", SourceFileLoader("lockstep._progress", path), origin=path)
            spec.has_location = True
            progress = _lockstep_module(spec)
            sys.modules["lockstep._progress"] = progress  # `import lockstep` later finds it
            try:
                spec.loader.exec_module(progress)
            except BaseException:
                del sys.modules["lockstep._progress"]
                raise
        progress.install()
    except Exception as e:  # never the user's program's problem
        print("lockstep: no progress record or stacks: %s" % e, file=sys.stderr, flush=True)


def _lockstep_chain():
    import os
    import sys
    from importlib.machinery import PathFinder

    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    paths = [p for p in sys.path if isinstance(p, str) and os.path.realpath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None or spec.origin is None:  # none, or a namespace package
        return
    ours = sys.modules.get("sitecustomize")
    module = _lockstep_module(spec)
    sys.modules["sitecustomize"] = module  # site's import then hands on this one, as without us
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules["sitecustomize"] = ours
        raise


_lockstep_install()
_lockstep_chain()
