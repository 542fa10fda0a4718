"""Golden numbers for src/table/paddle_rules.rs: PaddlePaddle's sparse rules as
paddle/fluid/distributed/ps/table/sparse_sgd_rule.cc writes them, with the defaults
python/paddle/distributed/ps/the_one_ps.py sets (learning rate 0.05, or 0.001 for Adam;
initial_g2sum 3; weight bounds [-10, 10]), in float64. Three pushes on w = [0.5, -1.0, 2.0]
with shows 2, 1, 3 and gradient sums show_t * [0.1 t, -0.2, 0.3 - 0.05 t].
Run: python3 tests/golden/paddle_sparse_rules.py"""
import math

SHOWS = [2.0, 1.0, 3.0]

def pushes():
    for t, show in zip(range(1, 4), SHOWS):
        yield show, [show * 0.1 * t, show * -0.2, show * (0.3 - 0.05 * t)]

def bound(x, lo=-10.0, hi=10.0):
    return min(max(x, lo), hi)

def naive(lr=0.05):
    w = [0.5, -1.0, 2.0]
    for _, g in pushes():
        w = [bound(wi - lr * gi) for wi, gi in zip(w, g)]
    return w

def sparse_adagrad(lr=0.05, init=3.0):
    w, g2sum = [0.5, -1.0, 2.0], 0.0
    for show, g in pushes():
        add = 0.0
        for i in range(3):
            sg = g[i] / show
            w[i] = bound(w[i] - lr * sg * math.sqrt(init / (init + g2sum)))
            add += sg * sg
        g2sum += add / 3
    return w

def std_adagrad(lr=0.05, init=3.0):
    w, g2sum = [0.5, -1.0, 2.0], [0.0] * 3
    for show, g in pushes():
        for i in range(3):
            sg = g[i] / show
            w[i] = bound(w[i] - lr * sg * math.sqrt(init / (init + g2sum[i])))
            g2sum[i] += sg * sg
    return w

def adam(lr=0.001, b1=0.9, b2=0.999, eps=1e-8):
    w, m, v, p1, p2 = [0.5, -1.0, 2.0], [0.0] * 3, [0.0] * 3, b1, b2
    for _, g in pushes():
        step = lr * math.sqrt(1 - p2) / (1 - p1)
        for i in range(3):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
            w[i] = bound(w[i] - step * (m[i] / (math.sqrt(v[i]) + eps)))
        p1, p2 = p1 * b1, p2 * b2
    return w

def shared_adam(lr=0.001, b1=0.9, b2=0.999, eps=1e-8):
    w, m, v, p1, p2 = [0.5, -1.0, 2.0], 0.0, 0.0, b1, b2
    for _, g in pushes():
        step = lr * math.sqrt(1 - p2) / (1 - p1)
        sm = sv = 0.0
        for i in range(3):
            nm = b1 * m + (1 - b1) * g[i]
            nv = b2 * v + (1 - b2) * g[i] * g[i]
            w[i] = bound(w[i] - step * (nm / (math.sqrt(nv) + eps)))
            sm += nm
            sv += nv
        m, v = sm / 3, sv / 3
        p1, p2 = p1 * b1, p2 * b2
    return w

for name, f in [("naive", naive), ("sparse_adagrad", sparse_adagrad), ("std_adagrad", std_adagrad),
                ("adam", adam), ("shared_adam", shared_adam)]:
    print(name, f())
