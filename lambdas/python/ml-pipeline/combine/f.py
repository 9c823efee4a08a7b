"""ml-pipeline-py `combine`: the trees gathered from every `train` instance, voted into a forest
and measured on the held-out test set.

Mirrors `ml-pipeline combine` (lambdas/src/ml.rs): writes result/model.json (the projection and
the forest, usable on raw rows) and result/accuracy.json.
"""

import io
import json

import numpy as np
import sonic


def predict(nodes, x):
    """The class of each row: rows walk down the tree together, one node at a time."""
    out = np.empty(len(x), dtype=np.int64)
    where = np.zeros(len(x), dtype=np.int64)
    todo = np.arange(len(x))
    for _ in range(len(nodes) + 1):
        if not len(todo):
            break
        still = []
        for node_id in np.unique(where[todo]):
            at = todo[where[todo] == node_id]
            node = nodes[node_id]
            if "class" in node:
                out[at] = node["class"]
            else:
                go_left = x[at, node["feature"]] < node["threshold"]
                where[at[go_left]] = node["left"]
                where[at[~go_left]] = node["right"]
                still.append(at)
        todo = np.concatenate(still) if still else todo[:0]
    return out


def vote(forest, x):
    votes = np.stack([predict(t, x) for t in forest])
    classes = int(votes.max()) + 1
    counts = np.stack([(votes == c).sum(axis=0) for c in range(classes)])
    return np.argmax(counts, axis=0)  # ties: the smallest class, as the Rust combine


def f(event):
    trained = []
    test = projection = None
    for i in sonic.inputs("train"):
        if i.name == "tree.json":
            trained.append(i.json())
        elif i.name == "test.npz":
            test = np.load(io.BytesIO(i.read_bytes()))
        elif i.name == "projection.json":
            projection = i.json()
    if not trained:
        raise ValueError("missing input tree.json")
    if test is None or projection is None:
        raise ValueError("missing input test.npz or projection.json (from train instance 0)")
    trained.sort(key=lambda t: t["instance"])
    x, y = test["x"], test["y"]
    for t in trained:
        for k, node in enumerate(t["tree"]["nodes"]):
            if "class" not in node and not (
                0 <= node["feature"] < x.shape[1]
                and k < node["left"] < len(t["tree"]["nodes"])
                and k < node["right"] < len(t["tree"]["nodes"])
            ):
                raise ValueError("tree %d: node %d is malformed" % (t["instance"], k))
    forest = [t["tree"]["nodes"] for t in trained]
    predicted = vote(forest, x)
    classes = sorted(set(int(c) for c in y))
    majority = max(int((y == c).sum()) for c in classes) / len(y)
    report = {
        "accuracy": float((predicted == y).mean()),
        "majority_baseline": majority,
        "classes": len(classes),
        "test_rows": int(len(y)),
        "trees": len(forest),
        "tree_test_accuracy": [float((predict(t, x) == y).mean()) for t in forest],
        "tree_validation_accuracy": [t["validation_accuracy"] for t in trained],
    }
    model = {"kind": "voting-forest", "classes": classes, "projection": projection,
             "trees": [{"nodes": t} for t in forest]}
    sonic.write_json("result", "model.json", model)
    sonic.write_json("result", "accuracy.json", report)
    print("combine: %d trees, accuracy %.4f (majority %.4f)" % (len(forest), report["accuracy"], majority))
    return None
