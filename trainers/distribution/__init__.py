"""Distribution: strategies, cluster roles from TF_CONFIG, and SLURM."""
