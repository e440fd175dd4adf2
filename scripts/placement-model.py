#!/usr/bin/env python3
"""How often gateway replicas that share nothing place a new prefix group on different
engines, for a placement rule, and how even one replica's placement is.

A model of the shared-prefix workload (G groups of P requests, shuffled, request i to
replica i mod N, 4 engines), after H single-request conversations (--history, each a new
prefix on whichever replica it reaches, not counted in the results): each replica places
a group the first time it sees it and keeps it there; a group placed on k engines costs
k - 1 extra prefills (copies). Rules:

  rotate    kvgate's: the engine whose last new prefix on this replica is the oldest;
            among engines that never started one, the best rendezvous-ranked
  least     the best rendezvous-ranked engine among those that started the fewest
            (kvgate's rule before the rotation: balanced from a fresh start, carries an
            old gap forward)
  rdv       the rendezvous ranking alone (agreement by construction, balance by chance)
  two       the less loaded of the two best-ranked engines
  oracle    exact balance with the final group count known in advance (an upper bound
            on what a count-based rule could agree on)

Prints, per rule and replica count: copies per run (mean of the seeds) and the share of
runs whose request split (max / min per engine) is within 1.3.

    python3 scripts/placement-model.py --groups 8 --prompts 16 --seeds 200 --history 13
"""

import argparse
import hashlib
import random

ENGINES = 4


def weight(key, engine):
    digest = hashlib.blake2b(f"{key}|{engine}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranked(key):
    return sorted(range(ENGINES), key=lambda e: -weight(key, e))


def place(rule, placed, key, groups):
    counts = [0] * ENGINES
    last = [-1] * ENGINES
    # dicts keep insertion order: a later placement is a later start
    for i, e in enumerate(placed.values()):
        counts[e] += 1
        last[e] = i
    order = ranked(key)
    if rule == "rotate":
        oldest = min(last)
        return next(e for e in order if last[e] == oldest)
    if rule == "rdv":
        return order[0]
    if rule == "two":
        a, b = order[0], order[1]
        return a if counts[a] <= counts[b] else b
    if rule == "least":
        least = min(counts)
        return next(e for e in order if counts[e] == least)
    if rule == "oracle":
        # the cap is on the workload's groups only, not on the history before them
        mine = [0] * ENGINES
        for g, e in placed.items():
            if not isinstance(g, tuple):
                mine[e] += 1
        cap = -(-groups // ENGINES)
        return next(e for e in order if mine[e] < cap)
    raise ValueError(rule)


def run(rule, groups, prompts, replicas, seed, history):
    rng = random.Random(seed)
    plan = [g for g in range(groups) for _ in range(prompts)]
    rng.shuffle(plan)
    plan = [("h", h) for h in range(history)] + plan
    seen = [dict() for _ in range(replicas)]
    holders = {}
    for i, g in enumerate(plan):
        mine = seen[i % replicas]
        if g not in mine:
            mine[g] = place(rule, mine, (seed, g), groups)
        if not isinstance(g, tuple):
            holders.setdefault(g, set()).add(mine[g])
    copies = sum(len(h) - 1 for h in holders.values())
    per = [0.0] * ENGINES
    for h in holders.values():
        for e in h:
            per[e] += prompts / len(h)
    split = max(per) / min(per) if min(per) > 0 else float("inf")
    return copies, split


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--history", type=int, default=0)
    ap.add_argument("--rules", default="rotate,least,rdv,two,oracle")
    a = ap.parse_args()
    print(
        f"{a.groups} groups x {a.prompts} prompts after {a.history} conversations, "
        f"{ENGINES} engines, {a.seeds} seeds"
    )
    print("rule     replicas  copies/run  split<=1.3")
    for rule in a.rules.split(","):
        for n in (1, 2, 4):
            res = [run(rule, a.groups, a.prompts, n, s, a.history) for s in range(a.seeds)]
            copies = sum(r[0] for r in res) / len(res)
            even = sum(r[1] <= 1.3 for r in res) / len(res)
            print(f"{rule:8} {n:8}  {copies:10.2f}  {even:10.2f}")


if __name__ == "__main__":
    main()
