"""The engine and what runs on it: THE forward engine (engine), the self-checks and their cases (check, cases), memory
operations counted on the simulator (counts), the workloads, and stage 10's whole job (whole, upload, graphs)."""
