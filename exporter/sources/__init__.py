"""The edges that read: NVML, sysfs, procfs, the kubelet, the Kubernetes and AWS APIs."""
