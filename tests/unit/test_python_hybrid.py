"""NNI's Python API in hybrid mode: ``Experiment(["local", "remote"])`` filled in attribute by attribute."""

from __future__ import annotations

from trialbus.experiment import Experiment


def test_a_list_of_platforms_makes_a_hybrid_config_as_nni_python_scripts_write_it():
    experiment = Experiment(["local", "remote"], nats_url="nats://127.0.0.1:1")  # nothing is contacted yet
    experiment.config.trial_command = "python3 trial.py"
    experiment.config.trial_concurrency = 4
    experiment.config.search_space = {"x": {"_type": "uniform", "_value": [0, 1]}}
    experiment.config.tuner.name = "Random"
    experiment.config.training_service[1].machine_list = [{"host": "10.0.0.2", "user": "bob", "password": "pw"}]
    config = experiment.validated_config()
    assert config.hybrid and config.adapters == ["local-gpu", "remote"]
    assert config.training_services[1].machine_list[0].address == "bob@10.0.0.2:22"
