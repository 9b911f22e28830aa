"""The speed ladder and the committed results: the bench (bench, bench_table, bench_files, bench_baselines,
bench_whole, benchdoc), the device's ceilings, the cuDNN baseline, the committed GPU results (measured), the plots,
the autotuner (tune) and a bench's UNFINISHED marker."""
