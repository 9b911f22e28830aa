"""What the course is: the stages and their variants (stages), the tasks (tasks), the solutions' tagged cells (nbcells),
a release's given code (given) and ``labkit release`` (release, its leak search leak_search)."""
