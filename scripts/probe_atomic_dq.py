"""Trial (session 10, not kept): the backward with dQ added by the dK/dV kernel through float32 TMA
reductions (launch_backward(..., deterministic=False) at commit of this file) against the
deterministic two-kernel backward, H100. python scripts/probe_atomic_dq.py [--small] [--causal]"""
import sys, importlib, torch, triton.testing
from onlinesoftmax import plan
am = importlib.import_module("onlinesoftmax.attention")
causal_too = "--causal" in sys.argv
small = "--small" in sys.argv
shapes = [(1,2,2,256,128)] if small else [(4,16,16,4096,128),(1,16,16,16384,128),(2,32,8,8192,128),(4,32,32,4096,64)]
gen = torch.Generator(device="cuda").manual_seed(0)
def t(fn): return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
for B,Hq,Hkv,S,D in shapes:
    q = torch.randn(B,Hq,S,D,device="cuda",generator=gen).bfloat16(); k = torch.randn(B,Hkv,S,D,device="cuda",generator=gen).bfloat16()
    v = torch.randn_like(k); do = torch.randn_like(q)
    for mode in (("none","top_left") if causal_too else ("none",)):
        out, lse = am.launch_forward(q,k,v,mode,D**-0.5)
        f = 4*B*Hq*S*S*D*2.5/(2 if mode!="none" else 1)
        ref = am.launch_backward(do,q,k,v,out,lse,mode,D**-0.5)
        ms0 = t(lambda: am.launch_backward(do,q,k,v,out,lse,mode,D**-0.5))
        line = f"B{B} H{Hq}/{Hkv} S{S} D{D} {mode}: deterministic {f/ms0/1e9:.1f}"
        cfgs = [(32,128,8,3),(32,64,4,3)] if D==128 else [(32,64,4,3),(64,64,4,3),(32,128,8,3)]
        for cfg in cfgs:
            plan.ATTENTION_CONFIGS["backward_dkdv_atomic"] = ((1<<30, cfg, cfg),)
            g = am.launch_backward(do,q,k,v,out,lse,mode,D**-0.5,deterministic=False)
            torch.cuda.synchronize()
            err = max(((a.float()-b.float()).norm()/b.float().norm()).item() for a,b in zip(g,ref))
            ms = t(lambda: am.launch_backward(do,q,k,v,out,lse,mode,D**-0.5,deterministic=False))
            line += f" | atomic {cfg} {f/ms/1e9:.1f} (err {err:.1e}, {plan.last_attention_plan().tma_reduce})"
        print(line, flush=True)
