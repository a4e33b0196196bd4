# ruff: noqa: UP031  (the example's own %-formatting, kept as written)
# BSD 3-Clause License. Copyright (c) 2017, the pytorch/examples contributors.
# Modelled on https://github.com/pytorch/examples/blob/77f55b912142e11fcfdf5b530231fb9c52f181e8/dcgan/main.py
# (the same generator and discriminator, Adam(0.0002, beta1 0.5), --dataset fake, the DataLoader
# with --workers 2, per-step .item() logging, image dumps every 100 steps, and a torch.save of both
# nets every epoch). Changed for gpudiag's tests (tests/public/README.md): torchvision is not
# installed, so FakeData (random PIL images -> ToTensor) and save_image (one PNG) are inlined;
# time-bounded by PUBLIC_SECONDS; --no-checkpoint skips the per-epoch saves.
"""pytorch/examples DCGAN on CPU with --dataset fake."""

import argparse
import os
import random
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepclock import clock  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--dataset", default="fake", help="fake")
parser.add_argument("--workers", type=int, help="number of data loading workers", default=2)
parser.add_argument("--batchSize", type=int, default=16, help="input batch size")
parser.add_argument("--imageSize", type=int, default=64)
parser.add_argument("--nz", type=int, default=100, help="size of the latent z vector")
parser.add_argument("--ngf", type=int, default=16)
parser.add_argument("--ndf", type=int, default=16)
parser.add_argument("--niter", type=int, default=25, help="number of epochs to train for")
parser.add_argument("--lr", type=float, default=0.0002)
parser.add_argument("--beta1", type=float, default=0.5)
parser.add_argument("--outf", default=None, help="folder to output images and model checkpoints")
parser.add_argument("--manualSeed", type=int, default=999)
parser.add_argument("--no-checkpoint", action="store_true", help="fix: no per-epoch torch.save")
opt = parser.parse_args()
_tmp = tempfile.TemporaryDirectory(prefix="dcgan-")
outf = opt.outf or _tmp.name
random.seed(opt.manualSeed)
torch.manual_seed(opt.manualSeed)


class FakeData(torch.utils.data.Dataset):
    """torchvision's FakeData: a random image per index, as a PIL image, then ToTensor."""

    def __init__(self, size=1000, image_size=(3, 64, 64)):
        self.size, self.image_size = size, image_size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index)
        img = torch.randn(*self.image_size, generator=g)
        pil = Image.fromarray((img.clamp(-1, 1).add(1).mul(127.5)).byte().permute(1, 2, 0).numpy())
        x = torch.from_numpy(np.array(pil, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return x, int(torch.randint(0, 10, (1,), generator=g))


def save_image(t, path):
    grid = t[0].detach().add(1).mul(127.5).clamp(0, 255).byte().permute(1, 2, 0).numpy()
    Image.fromarray(grid).save(path)


dataset = FakeData(image_size=(3, opt.imageSize, opt.imageSize))
nc = 3
dataloader = torch.utils.data.DataLoader(
    dataset, batch_size=opt.batchSize, shuffle=True, num_workers=int(opt.workers)
)
device = torch.device("cpu")
nz, ngf, ndf = int(opt.nz), int(opt.ngf), int(opt.ndf)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 8),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


netG = Generator().to(device)
netG.apply(weights_init)
netD = Discriminator().to(device)
netD.apply(weights_init)
criterion = nn.BCELoss()
fixed_noise = torch.randn(opt.batchSize, nz, 1, 1, device=device)
real_label, fake_label = 1, 0
optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

done = False
for epoch in range(opt.niter):
    for i, data in enumerate(dataloader, 0):
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real_cpu = data[0].to(device)
        batch_size = real_cpu.size(0)
        label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype, device=device)
        output = netD(real_cpu)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()
        noise = torch.randn(batch_size, nz, 1, 1, device=device)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD_fake.backward()
        D_G_z1 = output.mean().item()
        errD = errD_real + errD_fake
        optimizerD.step()
        # (2) Update G network: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake)
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean().item()
        optimizerG.step()
        print(
            "[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f"
            % (epoch, opt.niter, i, len(dataloader), errD.item(), errG.item(), D_x, D_G_z1, D_G_z2)
        )
        if i % 100 == 0:
            save_image(real_cpu, "%s/real_samples.png" % outf)
            fake = netG(fixed_noise)
            save_image(fake.detach(), "%s/fake_samples_epoch_%03d.png" % (outf, epoch))
        if clock.step():
            done = True
            break
    if not opt.no_checkpoint:  # do checkpointing
        torch.save(netG.state_dict(), "%s/netG_epoch_%d.pth" % (outf, epoch))
        torch.save(netD.state_dict(), "%s/netD_epoch_%d.pth" % (outf, epoch))
    if done:
        break
