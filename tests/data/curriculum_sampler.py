"""A curriculum sampler written to verl's interface (data.sampler.class_path / class_name), for the tests: each
epoch visits the prompts hardest first (lowest mean score so far; unseen ones count 0, ties by row), and update()
records every step's scores. The epoch's order is fixed when the epoch starts and kept, with the scores, in
state_dict(), so a resumed run draws what the straight run drew. With RLCORE_TEST_SAMPLER_LOG set, every update
appends the rows it saw (one JSON line) there."""

import json
import os
from collections import defaultdict


class HardestFirstSampler:
    def __init__(self, data_source, data_config):
        self.size = len(data_source)
        self.totals, self.counts = defaultdict(float), defaultdict(int)
        self.epoch, self.order = 0, None
        self.log = os.environ.get("RLCORE_TEST_SAMPLER_LOG")

    def __len__(self):
        return self.size

    def set_epoch(self, epoch):
        if epoch != self.epoch:
            self.epoch, self.order = epoch, None

    def __iter__(self):
        if self.order is None:
            self.order = sorted(range(self.size), key=lambda i: (self.totals[i] / max(self.counts[i], 1), i))
        return iter(list(self.order))

    def update(self, batch):
        rows = [int(i) for i in batch.non_tensor_batch["index"]]
        for row, score in zip(rows, batch.batch["token_level_scores"].sum(-1).tolist()):
            self.totals[row] += score
            self.counts[row] += 1
        if self.log:
            with open(self.log, "a") as f:
                f.write(json.dumps({"epoch": self.epoch, "rows": rows, "order": self.order}) + "\n")

    def state_dict(self):
        return {"totals": dict(self.totals), "counts": dict(self.counts), "epoch": self.epoch, "order": self.order}

    def load_state_dict(self, state):
        self.totals, self.counts = defaultdict(float, state["totals"]), defaultdict(int, state["counts"])
        self.epoch, self.order = state["epoch"], state["order"]


class NotASampler:
    def __init__(self, data_source, data_config):
        pass
