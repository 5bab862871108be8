"""Starting workers on the cluster engines spot fleets already run on.

- :mod:`vcasync.launch.ray`: workers as Ray actors on nodes that carry a spot resource, restarted by
  Ray on another node when theirs is preempted (``pip install "vcasync[ray]"``).
- Kubernetes needs no code here: ``deploy/k8s`` holds the manifests (see docs/engines.md).
"""
