"""ml-pipeline-py `pca`: the job's labelled CSV, a held-out test set, standardisation and PCA.

Mirrors `ml-pipeline pca` (lambdas/src/ml.rs): reads the CSV (numeric columns, the label named
`label` in the header or the last column), holds out `test_fraction` of the rows, standardises
and projects the training set onto `components` principal components, and broadcasts to every
`train` instance: train.npz and test.npz (projected features `x`, labels `y`) and
projection.json (mean, scale, center, components), so that the model works on raw rows.
"""

import io
import json

import numpy as np
import sonic


def read_csv(path):
    with open(path, "r") as fh:
        first = fh.readline()
        names = [n.strip() for n in first.split(",")]
        try:
            [float(n) for n in names]
            header, skip = None, 0
        except ValueError:
            header, skip = names, 1
    data = np.loadtxt(path, delimiter=",", skiprows=skip, dtype=np.float64, ndmin=2)
    if data.shape[0] == 0 or data.shape[1] < 2:
        raise ValueError("%s: need rows of features and a label" % path)
    if not np.isfinite(data).all():
        raise ValueError("%s: a value is not finite" % path)
    label = header.index("label") if header and "label" in header else data.shape[1] - 1
    y = data[:, label]
    if (y < 0).any() or (y != np.floor(y)).any() or (y > 65535).any():
        raise ValueError("%s: labels must be small whole numbers" % path)
    x = np.delete(data, label, axis=1)
    return x, y.astype(np.int64)


def save(to, name, **arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    sonic.write_bytes(to, name, buf.getvalue())


def f(event):
    p = event["params"]
    seed = int(p.get("seed", 42))
    test_fraction = float(p.get("test_fraction", 0.2))
    components = int(p.get("components", 6))
    if not 0 < test_fraction < 1:
        raise ValueError("parameter test_fraction: %s is not between 0 and 1" % test_fraction)
    if components < 1:
        raise ValueError("parameter components: must be at least 1")
    csvs = [i for i in sonic.inputs("input")]
    if not csvs:
        raise ValueError("missing input: a CSV job input")
    x, y = read_csv(csvs[0].path)
    n = len(y)
    if n < 2:
        raise ValueError("%d rows: need at least 2" % n)
    idx = np.random.default_rng([seed, 0x7E57]).permutation(n)
    n_test = min(max(int(round(n * test_fraction)), 1), n - 1)
    test, train = idx[:n_test], idx[n_test:]
    xt = x[train]
    mean = xt.mean(axis=0)
    scale = xt.std(axis=0)
    scale[scale <= 1e-12] = 1.0
    standard = (xt - mean) / scale
    center = standard.mean(axis=0)
    k = min(components, x.shape[1])
    # Principal axes: the right singular vectors of the centred training set.
    _, s, vt = np.linalg.svd(standard - center, full_matrices=False)
    comps = vt[:k]
    variance = s**2
    projection = {
        "mean": mean.tolist(),
        "scale": scale.tolist(),
        "center": center.tolist(),
        "components": comps.tolist(),
        "explained_variance_ratio": (variance[:k] / variance.sum()).tolist(),
    }

    def apply(rows):
        return ((rows - mean) / scale - center) @ comps.T

    save("train", "train.npz", x=apply(xt), y=y[train])
    save("train", "test.npz", x=apply(x[test]), y=y[test])
    sonic.write_json("train", "projection.json", projection)
    print("pca: %d rows, %d features, %d components, %d train, %d test"
          % (n, x.shape[1], k, len(train), len(test)))
    return None
