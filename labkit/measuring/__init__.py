"""Measuring one run: timers (timing), the report formats and throughput (report), the results ledger (ledger) and the
nvprof-like tables (profile)."""
