# A private Slurm for tests/slurm (slurmctld + two slurmd on this host, started by the tests
# themselves in a temp folder, no systemd). Only these packages are needed (`slurm-wlm` with
# recommends pulls 43); slurmdbd + mariadb-server are for the accounting-on test (about 13 s to
# install).
want slurmctld slurmd slurm-client munge slurmdbd mariadb-server
