"""Capacity as Kueue sees it: quota per flavor and cohort, and where a pod set can be placed."""
