"""Golden numbers for src/table/optim.rs: torch.optim's documented update rules (SGD, Adagrad,
Adam with weight_decay as L2), and Paddle's dense DAdamD2Sum (paddle/fluid/distributed/ps/table/
depends/dense.h, the rule `strategy.adam_d2sum` selects), in plain float64 Python, three steps on w = [0.5, -1.0, 2.0] with
batch-mean gradients g_t = [0.1 t, -0.2, 0.3 - 0.05 t]. Run: python3 tests/golden/optim.py"""
import math

def grads(t):
    return [0.1 * t, -0.2, 0.3 - 0.05 * t]

def sgd(lr, l2):
    w = [0.5, -1.0, 2.0]
    for t in range(1, 4):
        w = [wi - lr * (g + l2 * wi) for wi, g in zip(w, grads(t))]
    return w

def adagrad(lr, l2, eps=1e-10, init=0.0):
    w, s = [0.5, -1.0, 2.0], [init] * 3
    for t in range(1, 4):
        for i, g in enumerate(grads(t)):
            g = g + l2 * w[i]
            s[i] += g * g
            w[i] -= lr * g / (math.sqrt(s[i]) + eps)
    return w

def adam(lr, l2, b1=0.9, b2=0.999, eps=1e-8):
    w, m, v = [0.5, -1.0, 2.0], [0.0] * 3, [0.0] * 3
    for t in range(1, 4):
        for i, g in enumerate(grads(t)):
            g = g + l2 * w[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            denom = math.sqrt(v[i]) / math.sqrt(1 - b2 ** t) + eps
            w[i] -= lr / (1 - b1 ** t) * m[i] / denom
    return w

def adam_d2sum(lr, l2, mom_decay=0.99, ada_decay=0.9999, eps=1e-8):
    # Per weight: D2Sum, G2Sum and Moment start at 0 (the_one_ps.py's initializers).
    w, mom, g2, d2 = [0.5, -1.0, 2.0], [0.0] * 3, [0.0] * 3, [0.0] * 3
    for t in range(1, 4):
        for i, g in enumerate(grads(t)):
            g = g + l2 * w[i]
            d2[i] = d2[i] * ada_decay + 1
            g2[i] = g2[i] * ada_decay + g * g
            scale = math.sqrt((d2[i] + d2[i] * eps) / (g2[i] + d2[i] * eps))
            mom[i] = (mom[i] - g) * mom_decay + g
            w[i] -= lr * mom[i] * scale
    return w

print("sgd", sgd(0.1, 0.01))
print("adagrad", adagrad(0.1, 0.01))
print("adam", adam(0.1, 0.01))
print("adam_d2sum", adam_d2sum(0.1, 0.01))
print("adam_d2sum, l2 0, decays 0.9 and 0.99", adam_d2sum(0.1, 0.0, 0.9, 0.99))
