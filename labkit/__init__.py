"""labkit: the helper package of the CNN-on-GPU course kit.

A notebook imports one thing: ``import labkit as lk``. Names are grouped by the module that owns them; the modules
themselves are there too (``lk.gpu.launch``, ``lk.simulator.BATCHES``, ``lk.kernels.GIVEN`` ...).
"""

from . import runtime

runtime.apply()  # thread and warning settings, before anything imports numba's thread pool

from . import (ceilings, check, const_kernels, counts, data, device, engine, gemm, gemm_cuda, gpu, graphs,  # noqa: E402
               kernels, layers, ledger, measured, nbcells, nets, notebook, plots, profile, reference, report, simcheck,
               simulator, stages, streams, tensor_cores, timing, tune, weights_io, whole, workloads)
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
