"""The launch layer: device detection (device), process settings (runtime), launches, copies and the buffer pool (gpu),
streams and their order (streams, stream_order), the simulator's rules and checks (simulator, simcheck), arrays put
where freed ones were (freed), and CUDA C on the CPU (cudacpu)."""
