# A private Slurm for tests/slurm (slurmctld + two slurmd on this host, started by the tests
# themselves in a temp folder, no systemd). Only these four packages are needed (`slurm-wlm`
# with recommends pulls 43); see /work/shared/reference/slurm-facts.md.
want slurmctld slurmd slurm-client munge
