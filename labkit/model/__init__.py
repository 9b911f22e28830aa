"""The workloads' model: network specs (nets), the layer calling convention (layers), the numpy reference, the data sets
and the weights files. Depends on nothing else in labkit but labkit.outputs."""
