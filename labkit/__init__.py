"""labkit: the helper package of the CNN-on-GPU course kit.

A notebook imports one thing: ``import labkit as lk``. Names are grouped by the module that owns them.
"""

from .nets import NETS, Layer, Net, get_net, load_c_study_weights, load_weights, random_weights, save_weights
from .reference import accuracy, conv2d, fc, forward, maxpool2d, predict, relu, softmax, tanh

__version__ = "0.1.0"
