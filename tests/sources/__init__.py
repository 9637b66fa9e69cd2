"""The edges: NVML, sysfs, /dev/kmsg, the kubelet, the kube API, custom check scripts."""
