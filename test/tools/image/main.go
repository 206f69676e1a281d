// Command mkimage packs a static binary into a container image and writes it
// as an OCI image layout archive (the "oci-archive" format skopeo and podman
// read), without a container daemon or registry:
//
//	mkimage --binary bin/static/ferry-broker --version v0.1.0 --out bin/images/ferry-broker.oci.tar
//
// The image holds the binary at /<name> (mode 0755), /etc/passwd and
// /etc/group naming the nonroot user 65532, an empty /tmp and, with
// --ca-bundle, a CA bundle at /etc/ssl/certs/ca-certificates.crt; it runs as
// 65532:65532 with the binary as its entrypoint, like the Dockerfiles in
// deploy/images. Its content and timestamps depend only on the inputs and
// --created, so the same inputs give the same digests.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// User is the numeric user and group the images run as: distroless's
// "nonroot".
const User = "65532:65532"

// Options say what goes into one image.
type Options struct {
	// Binary is the static executable to pack.
	Binary string
	// Name is the image's name and the binary's path in it (/Name); default
	// the binary's file name.
	Name string
	// Version goes into the org.opencontainers.image.version label and the
	// layout's ref name.
	Version string
	// Revision is the source commit (org.opencontainers.image.revision).
	Revision string
	// CABundle, when set, is copied to /etc/ssl/certs/ca-certificates.crt.
	CABundle string
	// Arch and OS of the binary.
	Arch, OS string
	// Created is the image's creation time and every file's modification
	// time.
	Created time.Time
}

func main() {
	var o Options
	var out string
	var created int64
	flag.StringVar(&o.Binary, "binary", "", "static executable to pack (required)")
	flag.StringVar(&o.Name, "name", "", "image name and path of the binary in the image (default: the binary's file name)")
	flag.StringVar(&o.Version, "version", "dev", "version label and ref name")
	flag.StringVar(&o.Revision, "revision", "", "source commit label")
	flag.StringVar(&o.CABundle, "ca-bundle", "", "CA bundle to install at /etc/ssl/certs/ca-certificates.crt (optional)")
	flag.StringVar(&o.Arch, "arch", runtime.GOARCH, "architecture of the binary")
	flag.StringVar(&o.OS, "os", "linux", "operating system of the binary")
	flag.Int64Var(&created, "created", 0, "creation time, seconds since the epoch (e.g. the commit time)")
	flag.StringVar(&out, "out", "", "OCI archive to write (required)")
	flag.Parse()
	if o.Binary == "" || out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: mkimage --binary FILE --out FILE.oci.tar [--name NAME] [--version V] [--revision SHA] [--ca-bundle FILE] [--created UNIX]")
		os.Exit(2)
	}
	o.Created = time.Unix(created, 0).UTC()
	img, err := Build(o)
	if err == nil {
		err = WriteArchive(out, img, refName(o))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	d, _ := img.Digest()
	fmt.Printf("%s: %s %s (%s/%s)\n", out, name(o), d, o.OS, o.Arch)
}

func name(o Options) string {
	if o.Name != "" {
		return o.Name
	}
	return filepath.Base(o.Binary)
}

func refName(o Options) string {
	// A ref name is a tag: no '+' (a version's build metadata).
	return strings.ReplaceAll(o.Version, "+", "-")
}

// Build makes the image in memory.
func Build(o Options) (v1.Image, error) {
	n := name(o)
	bin, err := os.ReadFile(o.Binary)
	if err != nil {
		return nil, err
	}
	if len(bin) < 4 || !bytes.Equal(bin[:4], []byte("\x7fELF")) {
		return nil, fmt.Errorf("%s is not an ELF executable", o.Binary)
	}
	files := []file{
		{path: "etc/", mode: 0o755, dir: true},
		{path: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{path: "home/", mode: 0o755, dir: true},
		{path: "home/nonroot/", mode: 0o700, dir: true, uid: 65532, gid: 65532},
		{path: "tmp/", mode: 0o1777, dir: true},
		{path: n, mode: 0o755, data: bin},
	}
	if o.CABundle != "" {
		ca, err := os.ReadFile(o.CABundle)
		if err != nil {
			return nil, err
		}
		files = append(files,
			file{path: "etc/ssl/", mode: 0o755, dir: true},
			file{path: "etc/ssl/certs/", mode: 0o755, dir: true},
			file{path: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca})
	}
	layerTar, err := tarFiles(files, o.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}

	labels := map[string]string{
		"org.opencontainers.image.title":       n,
		"org.opencontainers.image.description": n + ", part of ferry: publishes a service cluster's APIs in kcp and syncs their objects",
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.created":     o.Created.Format(time.RFC3339),
	}
	if o.Revision != "" {
		labels["org.opencontainers.image.revision"] = o.Revision
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: o.Arch,
		OS:           o.OS,
		Created:      v1.Time{Time: o.Created},
		Config: v1.Config{
			User:       User,
			Entrypoint: []string{"/" + n},
			WorkingDir: "/",
			Env:        []string{"PATH=/", "HOME=/home/nonroot"},
			Labels:     labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: o.Created},
			CreatedBy: "mkimage: /" + n,
			Comment:   "ferry " + o.Version,
		},
	})
}

type file struct {
	path     string
	mode     int64
	dir      bool
	uid, gid int
	data     []byte
}

// tarFiles writes files as a tar stream, all with modification time t.
func tarFiles(files []file, t time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: t, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteArchive writes img as an OCI image layout (index.json, oci-layout,
// blobs/) packed into one tar file at path, the image tagged ref.
func WriteArchive(path string, img v1.Image, ref string) error {
	dir, err := os.MkdirTemp("", "mkimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref,
	})); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := tarDir(tmp, dir); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// tarDir packs the tree under dir into the tar file out, sorted by path,
// with fixed owners and times so that the archive depends only on content.
func tarDir(out, dir string) error {
	var paths []string
	if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	}); err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return errors.Join(err, f.Close())
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return errors.Join(err, f.Close())
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if fi.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		} else {
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, fi.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			return errors.Join(err, f.Close())
		}
		if !fi.IsDir() {
			if err := copyFile(tw, p); err != nil {
				return errors.Join(err, f.Close())
			}
		}
	}
	if err := tw.Close(); err != nil {
		return errors.Join(err, f.Close())
	}
	return f.Close()
}

func copyFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}
