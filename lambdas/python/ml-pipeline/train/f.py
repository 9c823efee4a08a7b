"""ml-pipeline-py `train`: one decision tree per instance on a random sample of the projected
training set.

Mirrors `ml-pipeline train` (lambdas/src/ml.rs): instance i fits a CART tree (Gini, depth at
most `max_depth`) on `sample_fraction` of the rows (seeded by `seed` and i), measures it on the
other rows and writes tree.json for `combine`; instance 0 also forwards test.npz and
projection.json, since `combine` reads only from `train`.
"""

import io

import numpy as np
import sonic


def load(name):
    for i in sonic.inputs():
        if i.name == name or i.name.endswith("/" + name):
            return i
    raise ValueError("missing input %s (is pca connected?)" % name)


def fit_tree(x, y, max_depth):
    """A CART tree as a node list (root first): {"feature", "threshold", "left", "right"} or
    {"class"}; rows with x[feature] < threshold go left."""
    classes = int(y.max()) + 1
    onehot = np.eye(classes, dtype=np.int64)[y]
    nodes = [None]
    stack = [(np.arange(len(y)), 0, 0)]
    while stack:
        rows, slot, depth = stack.pop()
        counts = onehot[rows].sum(axis=0)
        majority = int(np.argmax(counts))
        if (counts > 0).sum() <= 1 or depth >= max_depth or len(rows) < 2:
            nodes[slot] = {"class": majority}
            continue
        n = len(rows)
        parent = float((counts * counts).sum()) / n
        best = None
        for feature in range(x.shape[1]):
            values = x[rows, feature]
            order = np.argsort(values, kind="stable")
            v = values[order]
            left = np.cumsum(onehot[rows[order]], axis=0)[:-1]
            right = counts - left
            nl = np.arange(1, n, dtype=np.float64)
            score = (left * left).sum(axis=1) / nl + (right * right).sum(axis=1) / (n - nl)
            score[v[:-1] == v[1:]] = -np.inf
            i = int(np.argmax(score))
            if np.isfinite(score[i]) and (best is None or score[i] > best[0]):
                a, b = v[i], v[i + 1]
                threshold = a + (b - a) / 2.0
                if not threshold > a:
                    threshold = b
                best = (float(score[i]), feature, float(threshold))
        if best is None or best[0] <= parent + 1e-12 * n:
            nodes[slot] = {"class": majority}
            continue
        _, feature, threshold = best
        go_left = x[rows, feature] < threshold
        li, ri = len(nodes), len(nodes) + 1
        nodes.extend([None, None])
        nodes[slot] = {"feature": feature, "threshold": threshold, "left": li, "right": ri}
        stack.append((rows[~go_left], ri, depth + 1))
        stack.append((rows[go_left], li, depth + 1))
    return nodes


def predict(nodes, x):
    out = np.empty(len(x), dtype=np.int64)
    where = np.zeros(len(x), dtype=np.int64)
    todo = np.arange(len(x))
    while len(todo):
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
        todo = np.concatenate(still) if still else np.array([], dtype=np.int64)
    return out


def f(event):
    p = event["params"]
    seed = int(p.get("seed", 42))
    max_depth = max(int(p.get("max_depth", 10)), 1)
    sample = float(p.get("sample_fraction", 0.9))
    if not 0 < sample < 1:
        raise ValueError("parameter sample_fraction: %s is not between 0 and 1" % sample)
    me = event["instance"]
    data = np.load(io.BytesIO(load("train.npz").read_bytes()))
    x, y = data["x"], data["y"]
    n = len(y)
    idx = np.random.default_rng([seed, 1000 + me]).permutation(n)
    n_fit = min(max(int(round(n * sample)), 1), n)
    fit, val = idx[:n_fit], idx[n_fit:]
    nodes = fit_tree(x[fit], y[fit], max_depth)
    validation = float((predict(nodes, x[val]) == y[val]).mean()) if len(val) else 0.0
    sonic.write_json("combine", "tree.json", {
        "instance": me, "train_rows": int(len(fit)), "validation_rows": int(len(val)),
        "validation_accuracy": validation, "depth_limit": max_depth, "tree": {"nodes": nodes},
    })
    if me == 0:
        for name in ["test.npz", "projection.json"]:
            sonic.write_bytes("combine", name, load(name).read_bytes())
    print("train %d: %d rows, %d nodes, validation accuracy %.4f" % (me, len(fit), len(nodes), validation))
    return None
