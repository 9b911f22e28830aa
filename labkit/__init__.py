"""labkit: the helper package of the CNN-on-GPU course kit.

A notebook imports one thing: ``import labkit as lk``. Names are grouped by the module that owns them.
"""

import os
import warnings

# numba's OpenMP threads otherwise spin-wait between parallel regions, which starves every other process on a
# shared laptop or CI core (a prange stage then looks many times slower than it is). Set before numba loads it.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from numba.core.errors import NumbaPerformanceWarning

# Low-occupancy warnings fire on every small launch (one image, a tiny simulated grid) and bury the
# self-check lines; occupancy is taught with measurements instead.
warnings.simplefilter("ignore", NumbaPerformanceWarning)

from . import check, data, device, nbcells, nets, plots, profile, reference, timing
from .check import CheckResult, check_layer, check_layers, check_network
from .data import load_cifar10, load_fashion, load_inputs, to_input
from .nets import NETS, Layer, Net, get_net, load_c_study_weights, load_weights, random_weights, save_weights
from .profile import Profiler
from .reference import accuracy, conv2d, fc, forward, maxpool2d, predict, relu, softmax, tanh
from .runner import NetRun, run
from .stages import STAGES, Variant, check_variant, load_variants
from .timing import Ledger, RunReport, Timer, format_report, measure
from .workloads import Workload, workload

__version__ = "0.1.0"
