import json
M64=(1<<64)-1
SEED=0x5013_1c5e_ed00_0001
def splitmix(st):
    st=(st+0x9E3779B97F4A7C15)&M64; z=st
    z=((z^(z>>30))*0xBF58476D1CE4E5B9)&M64
    z=((z^(z>>27))*0x94D049BB133111EB)&M64
    return st, z^(z>>31)
def ls(x,y,deg):
    if deg==0: return [sum(y)/len(y)]
    A=[[1.0]+[xi**(j+1) for j in range(deg)] for xi in x]
    p=deg+1
    N=[[sum(A[r][i]*A[r][j] for r in range(len(A))) for j in range(p)]+[sum(A[r][i]*y[r] for r in range(len(A)))] for i in range(p)]
    for col in range(p):
        piv=max(range(col,p),key=lambda r:abs(N[r][col])); N[col],N[piv]=N[piv],N[col]
        if abs(N[col][col])<1e-300: return None
        for r in range(p):
            if r!=col:
                f=N[r][col]/N[col][col]
                N[r]=[a-f*b for a,b in zip(N[r],N[col])]
    return [N[i][p]/N[i][i] for i in range(p)]
def poly(c,x): 
    t=0
    for k in reversed(c): t=t*x+k
    return t
def fit(samples, seed, floor_q=0.25):
    n=len(samples)
    if n==0: return None
    scale=max(abs(s[0]) for s in samples) or 1.0
    xs=[s[0]/scale for s in samples]; ys=[s[1] for s in samples]
    mean_abs=sum(abs(y) for y in ys)/n
    floor=max(floor_q,1e-3*mean_abs,1e-12)
    k=min(5,n); order=list(range(n))
    st=seed^((n*0x2545F4914F6CDD1D)&M64)
    for i in range(n-1,0,-1):
        st,z=splitmix(st); j=z%(i+1); order[i],order[j]=order[j],order[i]
    fold=[0]*n
    for pos,i in enumerate(order): fold[i]=pos%k
    def cv(deg):
        if k<2: return None
        err=0
        for f in range(k):
            tx=[xs[i] for i in range(n) if fold[i]!=f]; ty=[ys[i] for i in range(n) if fold[i]!=f]
            if len(set(tx))<deg+1: return None
            c=ls(tx,ty,deg)
            if c is None: return None
            for i in range(n):
                if fold[i]==f:
                    p=max(poly(c,xs[i]),0.0)
                    err+=abs(p-ys[i])/max(abs(ys[i]),floor)
        return err/n
    best=None
    for d in (1,2,3):
        m=cv(d)
        if m is not None and (best is None or m<0.95*best[1]-1e-9): best=(d,m)
    if best: deg,cvm=best
    elif len(set(xs))>=2: deg,cvm=1,float('inf')
    else: deg=0; cvm=cv(0)
    c=ls(xs,ys,deg)
    coef=[v/scale**j for j,v in enumerate(c)]
    return dict(degree=deg,coef=coef,cv=cvm,n=n)
def predict(f,x):
    return None if f is None else max(poly(f['coef'],x),0.0)
def seeds(fnames):
    out={}; k=0
    for fn in fnames:
        d={}
        for q in ('memory_mb','cold_s','hot_s','instances'):
            k+=1; d[q]=(SEED+k*0x9E3779B9)&M64
        d['overhead_s']=SEED^((0x0BE74EAD*0x9E3779B9)&M64)
        d['start_s']=SEED^((0x057A2750*0x9E3779B9)&M64)
        out[fn]=d
    return out
ORDER={'mapreduce-sort':['split','map','reduce'],'synthetic-chain':['a','b','c']}
def fit_models(dag, samples):
    """samples: list of (x, {fn:{cold_s,hot_s,overhead_s,start_s,...}}) -> {fn:{q:fit}}"""
    S=seeds(ORDER[dag]); out={}
    for fn in ORDER[dag]:
        out[fn]={}
        for q in ('cold_s','hot_s','overhead_s','start_s'):
            pts=[(x,f[fn][q]) for x,f in samples if f.get(fn,{}).get(q) is not None]
            out[fn][q]=fit(pts,S[fn][q]) if pts else None
            out[fn][q+'_pts']=pts
    return out
