// Command ocibuild assembles an OCI image from directories, without a container engine,
// and writes it as an OCI image layout. scripts/image.sh stages the directories; this
// program only turns them into layers and an image config.
//
// The output depends on nothing but the directories' contents and the flags (and the
// Go toolchain's compress/gzip): every tar entry is owned by 0:0 with mtime --created,
// entries are in lexical order, the layers are gzipped with no name and no timestamp in
// the header, and the config's created time is --created. Building twice gives the same digest.
//
//	ocibuild --layer DIR [--layer DIR]... --entrypoint '["/bin/x"]' [--cmd '["run"]']
//	         [--user 65532:65532] [--env K=V]... [--port 8080/tcp]... [--label K=V]...
//	         [--created UNIX_SECONDS] [--arch amd64] --tag NAME:TAG --out DIR
//
// It prints the image digest (sha256:...) on stdout.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var layers, env, ports, labels list
	flag.Var(&layers, "layer", "directory whose contents become one layer (repeatable, bottom first)")
	flag.Var(&env, "env", "K=V in the image config (repeatable)")
	flag.Var(&ports, "port", "exposed port, e.g. 8080/tcp (repeatable)")
	flag.Var(&labels, "label", "K=V label (repeatable)")
	entrypoint := flag.String("entrypoint", "", "entrypoint as a JSON list")
	cmd := flag.String("cmd", "", "default arguments as a JSON list")
	user := flag.String("user", "", "user[:group] the image runs as")
	created := flag.Int64("created", 0, "creation time (Unix seconds) of the image and of every file")
	arch := flag.String("arch", "amd64", "architecture")
	tag := flag.String("tag", "", "name:tag recorded in the layout's index (org.opencontainers.image.ref.name)")
	out := flag.String("out", "", "output directory (an OCI image layout; replaced)")
	flag.Parse()
	if len(layers) == 0 || *entrypoint == "" || *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	digest, err := build(layers, env, ports, labels, *entrypoint, *cmd, *user, time.Unix(*created, 0).UTC(), *arch, *tag, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ocibuild:", err)
		os.Exit(1)
	}
	fmt.Println(digest)
}

func build(layers, env, ports, labels []string, entrypoint, cmd, user string, created time.Time, arch, tag, out string) (string, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, dir := range layers {
		// Compressed here, once, in memory: the layer is read several times (digest,
		// diff id, write) and the build machine's /tmp may be small.
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		if err := tarDir(zw, dir, created); err != nil {
			return "", fmt.Errorf("layer %s: %w", dir, err)
		}
		if err := zw.Close(); err != nil {
			return "", err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(gz.Bytes())), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return "", fmt.Errorf("layer %s: %w", dir, err)
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:   layer,
			History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "ocibuild --layer " + filepath.Base(dir)},
		})
		if err != nil {
			return "", err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: created}
	cf.OS = "linux"
	cf.Architecture = arch
	if err := json.Unmarshal([]byte(entrypoint), &cf.Config.Entrypoint); err != nil {
		return "", fmt.Errorf("--entrypoint: %w", err)
	}
	if cmd != "" {
		if err := json.Unmarshal([]byte(cmd), &cf.Config.Cmd); err != nil {
			return "", fmt.Errorf("--cmd: %w", err)
		}
	}
	cf.Config.User = user
	cf.Config.Env = env
	if len(ports) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range ports {
			cf.Config.ExposedPorts[p] = struct{}{}
		}
	}
	if len(labels) > 0 {
		cf.Config.Labels = map[string]string{}
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				return "", fmt.Errorf("--label %q: want K=V", l)
			}
			cf.Config.Labels[k] = v
		}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	if err := os.RemoveAll(out); err != nil {
		return "", err
	}
	path, err := layout.Write(out, empty.Index)
	if err != nil {
		return "", err
	}
	var opts []layout.Option
	if tag != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag}))
	}
	if err := path.AppendImage(img, opts...); err != nil {
		return "", err
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	return digest.String(), nil
}

// tarDir writes dir to w as an uncompressed tar: entries in lexical order, owned by 0:0, with
// the permission bits found on disk and mtime `created`. Regular files, directories and
// symlinks only.
func tarDir(w io.Writer, dir string, created time.Time) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		hdr := &tar.Header{
			Name:    filepath.ToSlash(rel),
			Mode:    int64(info.Mode().Perm()),
			ModTime: created,
			Format:  tar.FormatPAX,
		}
		if info.Mode()&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		switch {
		case info.IsDir():
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case info.Mode()&fs.ModeSymlink != 0:
			hdr.Typeflag = tar.TypeSymlink
			if hdr.Linkname, err = os.Readlink(path); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			hdr.Typeflag = tar.TypeReg
			hdr.Size = info.Size()
		default:
			return fmt.Errorf("%s: unsupported file type %s", path, info.Mode().Type())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
