import os,pickle
rows=pickle.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)),'rows.pkl'),'rb'))
e=lambda p,m:(p-m)/m*100
V=['rep','old','new','new_med','new_cap','new_cap2']
print('job              meas   '+'  '.join(v.rjust(8) for v in V))
for r in rows:
    print(f"r{r['run']} {r['dag'][:5]} {r['kind']}{r['x']/1e6:<3.0f} n{r['nsamp']:<3d} {r['meas']:.3f} "+'  '.join(f"{e(r[v],r['meas']):+7.1f}%" for v in V))
def summ(sel,name):
    out=[]
    for v in V:
        a=[abs(e(r[v],r['meas'])) for r in sel]
        out.append(f"{v} {sum(a)/len(a):.1f}/{sum(x<=15 for x in a)}/{max(a):.0f}")
    print(f"{name:28s} n={len(sel):2d} | "+' | '.join(out))
ex=lambda r: not (r['run']==4 and r['dag']=='mapreduce-sort' and (r['x']==20e6 or r['kind']=='D'))
srt=[r for r in rows if r['dag']=='mapreduce-sort']
print('MAE% / count<=15% / max')
summ(srt,'sort'); summ(rows,'all')
summ([r for r in srt if ex(r)],'sort excl r4 P20+D10'); summ([r for r in rows if ex(r)],'all excl r4 P20+D10')
diff=[r for r in rows if abs(r['old']-r['new'])>1e-9]
summ(diff,'jobs where old!=new'); summ([r for r in diff if ex(r)],'old!=new excl r4')
