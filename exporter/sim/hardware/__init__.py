"""Simulated node hardware: profiles, an NVML library with pynvml's interface, a sysfs tree."""
