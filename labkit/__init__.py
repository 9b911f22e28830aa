"""labkit: the helper package of the CNN-on-GPU course kit.

A notebook imports one thing: ``import labkit as lk``. Names are grouped by the module that owns them; the modules
themselves are there too (``lk.gpu.launch``, ``lk.simulator.BATCHES``, ``lk.kernels.GIVEN`` ...). The modules a
student release may leave out (``LATE``: docs/releases.md) are imported on first use, ``lk.gemm`` as before.

The package is in layers, one subpackage per concern (docs/design.md, "Layout"): model, launch, measuring, course,
ops, core, ladder, lessons, grading, then the command (cli). Every module that used to sit at the package's root
keeps its old name: ``lk.gpu``, ``from labkit import gpu``, ``import labkit.gpu`` and ``from labkit.gpu import
launch`` all give the module ``labkit.launch.gpu`` itself (``MOVED``, the one table of old names), so notebooks,
submissions, tests and tools written against the old names keep working.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from .about import MOVED, __version__, new_name, old_name  # noqa: F401 - lk.__version__, lk.old_name
from .launch import runtime

runtime.apply()  # thread and warning settings, before anything imports numba's thread pool


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import labkit.gpu``: the module ``labkit.launch.gpu`` itself under its old name too (one module object,
    so a patch through either name is seen through both)."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if new_name(fullname) else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        # the import system hands back sys.modules[name] once this returns: the real module
        sys.modules[module.__name__] = importlib.import_module(new_name(module.__name__))


if not any(isinstance(f, _OldNames) for f in sys.meta_path):
    # first: a release's data folder labkit/given/ must not be taken for the module labkit.given
    sys.meta_path.insert(0, _OldNames())


#: modules imported on first use (``lk.gemm``): a release of an early milestone leaves them out (they answer a task
#: of it, labkit.leave_out.LEAVE_OUT), and ``import labkit`` must work there
LATE = ("gemm", "gemm_cuda", "fc_tensor_cores", "tensor_cores", "whole", "precision")


def __getattr__(name: str):
    """``lk.gemm``, ``lk.bench``, ``from labkit import release``: a module imported on first use (``LATE``), or an
    old module name not yet imported."""
    if name in MOVED:
        try:
            module = importlib.import_module(f"{__name__}.{MOVED[name]}")
        except ModuleNotFoundError as exc:
            if name not in LATE or exc.name != f"{__name__}.{MOVED[name]}":
                raise
            raise AttributeError(f"labkit.{name} is not in this release of the kit: it answers a task of this "
                                 f"milestone or a later one (docs/releases.md)") from None
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from .core import check, counts, engine, graphs, workloads  # noqa: E402
from .course import nbcells, stages  # noqa: E402
from .ladder import ceilings, measured, plots, tune  # noqa: E402
from .launch import device, gpu, simcheck, simulator, streams  # noqa: E402
from .lessons import notebook  # noqa: E402
from .measuring import ledger, profile, report, timing  # noqa: E402
from .model import data, layers, nets, reference, weights_io  # noqa: E402
from .ops import const_kernels, kernels  # noqa: E402

from .lessons import show as _show_module  # noqa: E402

sys.modules.setdefault(f"{__name__}.show", _show_module)
# ^ lk.show is the function below: the module's old name is registered now, so that a later ``import labkit.show``
#   finds it done and does not bind the module over the function

from .core.check import CheckResult, check_layer, check_network, check_variant  # noqa: E402
from .core.engine import NetRun, run  # noqa: E402
from .core.workloads import Workload, workload  # noqa: E402
from .course.stages import STAGES, Variant, from_stage, load_variants, variants  # noqa: E402
from .lessons.notebook import hello  # noqa: E402
from .lessons.show import show  # noqa: E402 - lk.show(fn) and lk.show.failure(...): what each thread touches
from .measuring.ledger import Ledger  # noqa: E402
from .measuring.profile import Profiler  # noqa: E402
from .measuring.report import RunReport, format_report, format_throughput  # noqa: E402
from .measuring.timing import Timer, measure  # noqa: E402
from .model.data import load_cifar10, load_fashion, load_inputs, to_input  # noqa: E402
from .model.nets import NETS, Layer, Net, get_net, layer_cost, net_cost  # noqa: E402
from .model.reference import accuracy, conv2d, fc, forward, maxpool2d, predict, relu, softmax, tanh  # noqa: E402
from .model.weights_io import load_c_study_weights, load_weights, random_weights, save_weights  # noqa: E402
