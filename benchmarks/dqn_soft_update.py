"""A DQN on CartPole-v1 written as PyTorch's "Reinforcement Learning (DQN) Tutorial" writes it
(since its gymnasium version): a 3-layer MLP, a replay memory, AdamW, Huber loss, and the
target network's soft update every step through state dicts (`target_net_state_dict[key] =
policy * TAU + target * (1 - TAU)`, then `target_net.load_state_dict(...)`). `--inplace` makes
the same update in place (`torch._foreach_lerp_`), no state dict. Prints optimizer steps/s.

    pip install torch==2.13.0 gymnasium
    python benchmarks/dqn_soft_update.py --seconds 20 [--inplace]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import deque, namedtuple

BATCH_SIZE, GAMMA, EPS_START, EPS_END, EPS_DECAY, TAU, LR = 128, 0.99, 0.9, 0.05, 1000, 0.005, 1e-4
Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))


def build(n_obs: int, n_actions: int):
    """The tutorial's network: 128-unit MLP."""
    import torch.nn as nn

    return nn.Sequential(
        nn.Linear(n_obs, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, n_actions)
    )


def optimize(policy, target, memory, optimizer) -> bool:
    """One step of the tutorial's optimize_model(); False while the memory is short."""
    import torch
    import torch.nn as nn

    if len(memory) < BATCH_SIZE:
        return False
    batch = Transition(*zip(*random.sample(memory, BATCH_SIZE), strict=True))
    non_final = torch.tensor(tuple(s is not None for s in batch.next_state), dtype=torch.bool)
    non_final_next = torch.cat([s for s in batch.next_state if s is not None])
    state_b, action_b = torch.cat(batch.state), torch.cat(batch.action)
    reward_b = torch.cat(batch.reward)
    q = policy(state_b).gather(1, action_b)
    nxt = torch.zeros(BATCH_SIZE)
    with torch.no_grad():
        nxt[non_final] = target(non_final_next).max(1).values
    loss = nn.SmoothL1Loss()(q, (nxt * GAMMA + reward_b).unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy.parameters(), 100)
    optimizer.step()
    return True


def soft_update(policy, target, inplace: bool) -> None:
    """θ′ ← τ θ + (1 − τ) θ′: the tutorial's state dicts, or in place."""
    import torch

    if inplace:
        with torch.no_grad():
            torch._foreach_lerp_(list(target.parameters()), list(policy.parameters()), TAU)
        return
    target_sd, policy_sd = target.state_dict(), policy.state_dict()
    for key in policy_sd:
        target_sd[key] = policy_sd[key] * TAU + target_sd[key] * (1 - TAU)
    target.load_state_dict(target_sd)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--inplace", action="store_true", help="the soft update in place")
    args = p.parse_args()
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)
    random.seed(0)
    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    state, _ = env.reset(seed=0)
    policy, target = build(len(state), env.action_space.n), build(len(state), env.action_space.n)
    target.load_state_dict(policy.state_dict())
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR, amsgrad=True)
    memory: deque = deque([], maxlen=10000)
    done_steps, steps, t0 = 0, 0, time.time()
    while time.time() - t0 < args.seconds:
        state, _ = env.reset()
        s = torch.tensor(state, dtype=torch.float32).unsqueeze(0)
        while time.time() - t0 < args.seconds:
            eps = EPS_END + (EPS_START - EPS_END) * math.exp(-1.0 * done_steps / EPS_DECAY)
            done_steps += 1
            if random.random() > eps:
                with torch.no_grad():
                    action = policy(s).max(1).indices.view(1, 1)
            else:
                action = torch.tensor([[env.action_space.sample()]], dtype=torch.long)
            obs, reward, terminated, truncated, _ = env.step(action.item())
            r = torch.tensor([reward])
            nxt = None if terminated else torch.tensor(obs, dtype=torch.float32).unsqueeze(0)
            memory.append(Transition(s, action, nxt, r))
            s = nxt
            steps += optimize(policy, target, memory, optimizer)
            soft_update(policy, target, args.inplace)
            if terminated or truncated:
                break
    took = time.time() - t0
    print(f"{steps} optimizer steps in {took:.1f} s: {steps / took:.1f} steps/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
