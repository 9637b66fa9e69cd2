"""The cluster service: informers feed a pure ClusterModel; analyses, views and pages read it."""
