"""Planning a cluster: the roles a config asks for and their Ray bundles (``placement.py``), the
cluster's shape as Ray sees it (``cluster_shape.py``), where Ray will put each role and which node
stays idle (``plan_placing.py``), and ``agentrl plan``'s report (``plan.py``). Nothing here starts
an actor; the rollout and learning sides read their bundles from here."""
