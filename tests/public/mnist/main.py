# BSD 3-Clause License. Copyright (c) 2017, the pytorch/examples contributors.
# Modelled on https://github.com/pytorch/examples/blob/77f55b912142e11fcfdf5b530231fb9c52f181e8/mnist/main.py
# (the same Net, Adadelta + StepLR, per-sample PIL -> ToTensor -> Normalize, a DataLoader with
# the example's CPU arguments: no num_workers, i.e. 0; log every 10 batches with loss.item()).
# Changed for gpudiag's tests (tests/public/README.md): synthetic 28x28 digits made on the fly
# (no download), torchvision's two transforms inlined (torchvision is not installed), time-bounded
# by PUBLIC_SECONDS; --workers N passes num_workers=N (the example's accelerator setting).
"""pytorch/examples MNIST on CPU with synthetic digits."""

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from PIL import Image
from torch.optim.lr_scheduler import StepLR

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepclock import clock  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class SyntheticMNIST(torch.utils.data.Dataset):
    """MNIST's __getitem__: a uint8 image -> PIL 'L' image -> transform."""

    def __init__(self, n, seed):
        g = np.random.default_rng(seed)
        self.data = g.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        self.targets = g.integers(0, 10, size=n)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        img = Image.fromarray(self.data[index], mode="L")
        x = torch.from_numpy(np.array(img, dtype=np.float32) / 255.0).unsqueeze(0)  # ToTensor
        return (x - 0.1307) / 0.3081, int(self.targets[index])  # Normalize


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]"
                f"\tLoss: {loss.item():.6f}"
            )
        if clock.step():
            return True
    return False


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    print(f"Test set: Average loss: {test_loss / len(test_loader.dataset):.4f}, {correct} correct")


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--save-model", action="store_true", default=False)
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--workers", type=int, default=0, help="fix: num_workers")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    train_kwargs = {"batch_size": args.batch_size, "shuffle": True}
    test_kwargs = {"batch_size": args.test_batch_size}
    if args.workers:
        train_kwargs.update(num_workers=args.workers, persistent_workers=True)
    dataset1 = SyntheticMNIST(args.train_size, 1)
    dataset2 = SyntheticMNIST(1000, 2)
    train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)
    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        if train(args, model, device, train_loader, optimizer, epoch):
            break
        test(model, device, test_loader)
        scheduler.step()
    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == "__main__":
    main()
