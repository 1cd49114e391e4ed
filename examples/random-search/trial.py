"""One trial of the random-search demo, written for NNI's trial API and nothing else.

The "model" is a closed-form function of the hyper-parameters, so results are
repeatable and meaningful: accuracy peaks near learning_rate=0.01, dropout=0.2,
hidden_units=256, layers=3, batch_size=64, and the learning curve rises towards it.
"""

import math
import time

import nni


def accuracy(params: dict) -> float:
    lr = math.log10(params["learning_rate"])  # best at -2
    score = 0.95
    score -= 0.08 * (lr + 2) ** 2
    score -= 0.6 * (params["dropout"] - 0.2) ** 2
    score -= 0.05 * (math.log2(params["hidden_units"] / 256)) ** 2
    score -= 0.02 * (params["layers"] - 3) ** 2
    score -= 0.01 * abs(math.log2(params["batch_size"] / 64))
    return max(0.0, min(1.0, score))


#: Used when run by hand (``python trial.py``), where NNI hands out no parameters.
DEFAULTS = {"learning_rate": 0.01, "batch_size": 64, "dropout": 0.2, "hidden_units": 256, "layers": 3}


def main() -> None:
    params = {**DEFAULTS, **(nni.get_next_parameter() or {})}
    final = accuracy(params)
    for epoch in range(10):
        time.sleep(0.05)
        nni.report_intermediate_result(final * (1 - math.exp(-(epoch + 1) / 3)))
    nni.report_final_result(final)


if __name__ == "__main__":
    main()
