import json,sys
sys.path.insert(0,__import__('os').path.dirname(__file__))
from fit import fit, predict, seeds, ORDER, SEED
def mean(v): return sum(v)/len(v) if v else None
def unc(f):
    s=f.get('start_latency_s')
    if s is not None and s>=0: s=min(s,max(f['seconds'],0))
    c=f.get('start_contention')
    if s is not None and c and f['cold']:
        fac=max(c['starts']/max(c['cores'],1),1.0); alone=s/fac
        return f['seconds']-s+alone, alone, s-alone
    return f['seconds'], s, 0.0
def group_ovh(runs):
    if not runs: return None
    outs=[]; lams=[]
    for f in runs:
        sec,alone,wait=unc(f)
        outs.append(f['ended_s']-f['started_s']-wait); lams.append(f['seconds']-wait)
    return max(max(outs)-mean(lams),0.0)
