"""labkit: the helper package of the CNN-on-GPU course kit.

A notebook imports one thing: ``import labkit as lk``. Names are grouped by the module that owns them; the modules
themselves are there too (``lk.gpu.launch``, ``lk.simulator.BATCHES``, ``lk.kernels.GIVEN`` ...). The modules a
student release may leave out (``LATE``: docs/releases.md) are imported on first use, ``lk.gemm`` as before.
"""

from . import runtime

runtime.apply()  # thread and warning settings, before anything imports numba's thread pool

from . import (ceilings, check, const_kernels, counts, data, device, engine, gpu, graphs, kernels,  # noqa: E402
               layers, ledger, measured, nbcells, nets, notebook, plots, profile, reference, report, simcheck,
               simulator, stages, streams, timing, tune, weights_io, workloads)
from .check import CheckResult, check_layer, check_network, check_variant  # noqa: E402
from .data import load_cifar10, load_fashion, load_inputs, to_input  # noqa: E402
from .engine import NetRun, run  # noqa: E402
from .ledger import Ledger  # noqa: E402
from .notebook import hello  # noqa: E402
from .nets import NETS, Layer, Net, get_net, layer_cost, net_cost  # noqa: E402
from .profile import Profiler  # noqa: E402
from .show import show  # noqa: E402 - lk.show(fn) and lk.show.failure(...): what each thread touches
from .reference import accuracy, conv2d, fc, forward, maxpool2d, predict, relu, softmax, tanh  # noqa: E402
from .report import RunReport, format_report, format_throughput  # noqa: E402
from .stages import STAGES, Variant, from_stage, load_variants, variants  # noqa: E402
from .timing import Timer, measure  # noqa: E402
from .weights_io import load_c_study_weights, load_weights, random_weights, save_weights  # noqa: E402
from .workloads import Workload, workload  # noqa: E402

__version__ = "0.2.0"

#: modules imported on first use (``lk.gemm``): a release of an early milestone leaves them out (they answer a task
#: of it, labkit.leave_out.LEAVE_OUT), and ``import labkit`` must work there
LATE = ("gemm", "gemm_cuda", "tensor_cores", "whole")


def __getattr__(name: str):
    if name in LATE:
        from importlib import import_module

        try:
            return import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"labkit.{name} is not in this release of the kit: it answers a task of this "
                                 f"milestone or a later one (docs/releases.md)") from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
