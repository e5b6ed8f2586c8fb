"""Plain single-process torch.profiler exports (no torch.distributed): real rank-less traces."""
import gzip, shutil, sys
import torch
from torch.profiler import ProfilerActivity, profile, record_function

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for name in sys.argv[1:]:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(4):
            with record_function("train_step"):
                x = torch.randn(32, 64)
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            prof.step()
    prof.export_chrome_trace(name)
    with open(name, "rb") as f, gzip.open(name + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
