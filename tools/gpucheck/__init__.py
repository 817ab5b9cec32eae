"""`scripts/gpu-check.sh [--cpu] OUT` (= `python -m tools.gpucheck`): one run that proves orch's
GPU paths on a GPU machine (offline, one GPU, under 8 minutes) and writes OUT/report.json and
OUT/summary.md. With --cpu the same sections run at tiny sizes on the CPU (the CI rehearsal).

Sections: the built-in runner in 16-mixed and bf16-mixed; its throughput against a plain Lightning
script; a real CUDA out-of-memory and the halving that follows; exact resume with and without
`deterministic`; the notice checkpoint of BERT-large + AdamW held on the GPU against a bare
torch.save; the GPU's idle time between two queued jobs under a real daemon.

A check tool, not part of orch's runtime: the daemon and the CLI never import it."""
