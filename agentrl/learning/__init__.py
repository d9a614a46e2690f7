"""The learning side: the learner actor, one per DeepSpeed rank, that turns a step's groups into a
``TrainBatch`` and updates the policy (``learner.py``), and the group of ranks the driver calls as
one learner (``learner_group.py``)."""
