"""What the cluster service answers, read off the model: workload and preemption views, explain,
elastic jobs and idle GPUs."""
