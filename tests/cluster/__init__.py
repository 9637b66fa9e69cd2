"""The cluster service: model, Kueue semantics, placement, preemptions, quota, explain, UI,
history, leader election."""
