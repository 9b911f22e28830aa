"""Every task of every stage, one object each: what the student writes, how it is checked, what it is worth.

A stage notebook's tasks are the cells a student fills in (the solution's ``### BEGIN SOLUTION name`` blocks). The
grader takes what to run from here (``labkit.grading``): a task checked through the stage's ``VARIANTS`` (the layer
and network checks, accuracy and op time) is scored within the stage's correctness; a task with a check of its own
(stage 10's graph replay and pipeline) is run by the grader's child as a phase of its own and earns its own points
(``points``, which a rubric may change: ``[stage."10".tasks]``). A task whose answer is a prediction the notebook
compares with a measurement is not graded, and says so (``check = "notebook"``).

The function is found in a submission by its name (``function``): in the cells tagged ``kernel``, or, for a
notebook from an earlier release whose cell lacks the tag, in the cell that defines it.

Everything else about a task is read from here too: its number is its place in its stage (the spec's heading,
``heading``, must say it: ``tools/make_student.py`` refuses a solution whose heading does not), its size is the
lines of its ``blocks`` (the spec's "roughly N lines" and the stubs are rendered from them), its figures are the
scenes that name it (``labkit.lessons.scenes``), and a task written in steps checked one by one names them
(``steps``: stage 09's register tiles, ``labkit.lessons.tile_steps``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: how a task is checked: through the stage's VARIANTS; by the grader's phase of that name; only in the notebook
CHECKS = ("variants", "graph", "pipeline", "notebook")


@dataclass(frozen=True)
class Task:
    stage: str
    name: str  # short, for the rubric and the report
    title: str  # as the notebook's heading says it
    function: str  # the function (or kernel) the student writes, found by this name
    blocks: tuple[str, ...]  # the solution's blocks that are this task's answer
    check: str = "variants"
    points: float = 0.0  # its own points (0: scored within the stage's correctness)
    given: tuple[str, ...] = ()  # given variants its check runs on ("09 tuned_cifar10": stage 09's solution)
    steps: tuple[str, ...] = ()  # a step's letter per block, for a task written in steps checked one by one

    @property
    def own_phase(self) -> bool:
        """Whether the grader runs a phase of its own for it (and scores it apart)."""
        return self.check not in ("variants", "notebook")

    @property
    def number(self) -> int:
        """Its place in its stage, from 1: the number its heading and its figures' names carry."""
        return of_stage(self.stage).index(self) + 1

    @property
    def heading(self) -> str:
        """The spec's heading, as the notebook writes it (markdown): a stage's only task has no number."""
        number = f" {self.number}" if len(of_stage(self.stage)) > 1 else ""
        return f"Task{number} — {self.title}"

    @property
    def label(self) -> str:
        """The title as a figure or a report line prints it (no markdown)."""
        return self.title.replace("`", "")

    @property
    def step_names(self) -> tuple[tuple[str, str], ...]:
        """(step, block) in the order a student writes them."""
        return tuple(zip(self.steps, self.blocks))


def _t(stage, name, title, function, blocks=None, **kw) -> Task:
    return Task(stage, name, title, function, tuple(blocks or (name,)), **kw)


TASKS: dict[str, tuple[Task, ...]] = {
    "01": (_t("01", "conv_point", "one output element of the convolution", "conv_point"),
           _t("01", "conv_forward", "the loop nest", "conv_forward"),
           _t("01", "cheap_layers", "the cheap layers", "relu_forward",
              ("relu", "tanh", "maxpool", "fc", "softmax"))),
    "02": (_t("02", "prange", "`prange` over the images, over the output maps", "conv_prange_n",
              ("prange_n", "prange_m")),
           _t("02", "prange_reduction", "only the reduction in parallel", "conv_prange_reduction"),
           _t("02", "gpu_mappings", "one thread per output element; one block per output map",
              "conv_thread_per_output_kernel", ("thread_kernel", "thread_launch", "map_kernel", "map_launch")),
           _t("02", "tree", "only the reduction in parallel, on the GPU", "conv_reduction_kernel")),
    "03": (_t("03", "with_managed", "one managed-memory wrapper for every layer", "with_managed"),),
    "04": (_t("04", "pad", "pad once", "pad_kernel"),
           _t("04", "padded", "a convolution without bounds tests", "conv_padded_kernel",
              ("padded_kernel", "padded_launch")),
           _t("04", "classify", "`uint8` in, probabilities out", "classify", ("normalize", "classify"),
              check="notebook")),
    "05": (_t("05", "tiled_kernel", "the tiled kernel", "make_tiled_kernel"),
           _t("05", "tiled_launch", "the launch", "conv_tiled"),
           _t("05", "predicted", "predict the global loads, then count them", "predicted_loads", check="notebook")),
    "06": (_t("06", "const_kernel", "a kernel with the weights in constant memory", "make_const_kernel"),
           _t("06", "const_c", "the same kernel in CUDA C, with a `__constant__` array", "conv_const_c")),
    "07": (_t("07", "unroll", "the unroll kernel", "unroll_kernel"),
           _t("07", "matmul", "the tiled matrix multiply", "make_matmul_kernel"),
           _t("07", "predicted", "predict, then count", "predicted_loads", check="notebook")),
    "08": (_t("08", "fused", "implicit GEMM with a fused epilogue", "make_fused_kernel", ("gather", "epilogue")),
           _t("08", "atomic", "the reduction over input channels, with atomics", "conv_atomic_kernel")),
    "09": (_t("09", "pooled", "one thread per pooled output, every map at once", "make_pooled_kernel"),
           _t("09", "pooled_c", "the same kernel in CUDA C, with and without `__restrict__` and `#pragma unroll`",
              "conv_pooled_c"),
           _t("09", "tiles", "register tiles, in four steps", "conv_tiles",
              ("load_window", "add_channel", "stage_weights", "sum_channels", "store_tile"), steps=("a", "b", "c", "c", "d")),
           _t("09", "candidates", "the search space", "candidates", check="notebook")),
    "10": (_t("10", "splitk", "fc1 as a split-K matrix product", "fc_splitk_kernel"),
           _t("10", "graph", "the whole call as one CUDA graph", "graph_call", check="graph", points=15.0,
              given=("09 tuned_cifar10", "09 pooled")),
           _t("10", "streamed", "host bytes to host classes, over streams", "classify_streamed", check="pipeline",
              points=15.0, given=("09 tuned_cifar10",))),
}


def of_stage(stage: str) -> tuple[Task, ...]:
    return TASKS.get(str(stage).zfill(2), ())


def own_phases(stage: str) -> tuple[Task, ...]:
    """The stage's tasks the grader runs and scores apart (stage 10's graph and pipeline)."""
    return tuple(t for t in of_stage(stage) if t.own_phase)


def find(stage: str, name: str) -> Task:
    for task in of_stage(stage):
        if task.name == name:
            return task
    raise KeyError(f"stage {stage} has no task {name!r}; its tasks are "
                   f"{', '.join(t.name for t in of_stage(stage)) or 'none'}")
