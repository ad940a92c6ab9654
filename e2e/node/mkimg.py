import hashlib, json, os, tarfile, io, sys, gzip, time
# usage: mkimg.py NAME(full ref) OUT.tar ENTRYPOINT_JSON
name, out, ep = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def blob(b):
    d = hashlib.sha256(b).hexdigest(); return d, b
# layer
lb = io.BytesIO()
with tarfile.open(fileobj=lb, mode='w', format=tarfile.PAX_FORMAT) as t:
    def d(p):
        ti = tarfile.TarInfo(p); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; t.addfile(ti)
    for p in ['bin','tmp','etc','proc','sys','dev','www']: d(p)
    t.add('/bin/busybox', arcname='bin/busybox')
    for l in ['sh','sleep','httpd','ls','cat','echo','wget','ps','id','hostname','env']:
        ti = tarfile.TarInfo('bin/'+l); ti.type = tarfile.SYMTYPE; ti.linkname='busybox'; t.addfile(ti)
    for fn, c in [('etc/passwd','root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n'),('etc/group','root:x:0:\nnobody:x:65534:\n'),('www/index.html','hello from busybox\n')]:
        b = c.encode(); ti = tarfile.TarInfo(fn); ti.size=len(b); ti.mode=0o644; t.addfile(ti, io.BytesIO(b))
raw = lb.getvalue()
diffid = hashlib.sha256(raw).hexdigest()
gz = gzip.compress(raw, mtime=0)
ld, _ = blob(gz)
cfg = {"architecture":"amd64","os":"linux","config":{"Entrypoint":ep,"Env":["PATH=/bin"],"WorkingDir":"/"},
       "rootfs":{"type":"layers","diff_ids":["sha256:"+diffid]},"history":[{"created_by":"mkimg.py"}]}
cb = json.dumps(cfg).encode(); cd = hashlib.sha256(cb).hexdigest()
man = {"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
       "config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:"+cd,"size":len(cb)},
       "layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:"+ld,"size":len(gz)}]}
mb = json.dumps(man).encode(); md = hashlib.sha256(mb).hexdigest()
tag = name.rsplit(':',1)[1]
idx = {"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":man["mediaType"],"digest":"sha256:"+md,"size":len(mb),
       "annotations":{"io.containerd.image.name":name,"org.opencontainers.image.ref.name":tag}}]}
with tarfile.open(out,'w') as t:
    def add(n,b):
        ti=tarfile.TarInfo(n); ti.size=len(b); ti.mode=0o644; t.addfile(ti, io.BytesIO(b))
    add('oci-layout', b'{"imageLayoutVersion":"1.0.0"}')
    add('index.json', json.dumps(idx).encode())
    for dg,b in [(ld,gz),(cd,cb),(md,mb)]: add('blobs/sha256/'+dg,b)
print(out, 'manifest sha256:'+md)
