package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestArchiveRoundTrip packs an executable (this test binary) and reads the
// archive back with go-containerregistry's layout reader.
func TestArchiveRoundTrip(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Binary: self, Name: "ferry-test", Version: "v1.2.3+abc", Revision: "abc", Arch: "amd64", OS: "linux", Created: time.Unix(1700000000, 0).UTC()}
	img, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "ferry-test.oci.tar")
	if err := WriteArchive(out, img, refName(o)); err != nil {
		t.Fatal(err)
	}
	got := readArchive(t, out)
	checkImage(t, got, "ferry-test", self)
	if got.ref != "v1.2.3-abc" {
		t.Errorf("ref name %q, want v1.2.3-abc", got.ref)
	}
	cfg := got.config.Config
	if cfg.Labels["org.opencontainers.image.version"] != "v1.2.3+abc" || cfg.Labels["org.opencontainers.image.revision"] != "abc" {
		t.Errorf("labels %v", cfg.Labels)
	}
	if !got.config.Created.Equal(o.Created) {
		t.Errorf("created %s, want %s", got.config.Created, o.Created)
	}

	// The same inputs give the same image.
	again, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("two builds from the same inputs: digests %s and %s", d1, d2)
	}
}

func TestBuildRefusesNonELF(t *testing.T) {
	p := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(Options{Binary: p, Arch: "amd64", OS: "linux"}); err == nil || !strings.Contains(err.Error(), "not an ELF executable") {
		t.Fatalf("got %v, want a refusal naming a non-ELF file", err)
	}
}

// TestMadeImages checks the archives make image wrote (make test-image sets
// FERRY_IMAGE_DIR and FERRY_STATIC_BIN_DIR): each holds its static binary at
// /<name>, runs it as 65532:65532 and has it as its entrypoint.
func TestMadeImages(t *testing.T) {
	dir, bins := os.Getenv("FERRY_IMAGE_DIR"), os.Getenv("FERRY_STATIC_BIN_DIR")
	if dir == "" || bins == "" {
		t.Skip("FERRY_IMAGE_DIR and FERRY_STATIC_BIN_DIR are not set: run through make test-image, which builds the images first")
	}
	for _, name := range []string{"ferry-broker", "ferry-edge"} {
		t.Run(name, func(t *testing.T) {
			bin := filepath.Join(bins, name)
			got := readArchive(t, filepath.Join(dir, name+".oci.tar"))
			checkImage(t, got, name, bin)
			checkStatic(t, got.files["/"+name].data)
			if v := got.config.Config.Labels["org.opencontainers.image.version"]; v == "" {
				t.Error("no org.opencontainers.image.version label")
			}
		})
	}
}

type image struct {
	ref    string
	config *v1.ConfigFile
	files  map[string]entry
}

type entry struct {
	hdr  *tar.Header
	data []byte
}

// readArchive unpacks an OCI archive and reads its single image with
// go-containerregistry's layout package.
func readArchive(t *testing.T, path string) image {
	t.Helper()
	dir := t.TempDir()
	untar(t, path, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%s: %d manifests in index.json, want 1", path, len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want %s", desc.MediaType, types.OCIManifestSchema1)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]entry{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files["/"+strings.TrimSuffix(h.Name, "/")] = entry{hdr: h, data: data}
		}
		rc.Close()
	}
	return image{ref: desc.Annotations["org.opencontainers.image.ref.name"], config: cfg, files: files}
}

func checkImage(t *testing.T, got image, name, binary string) {
	t.Helper()
	cfg := got.config
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cfg.Config.User)
	}
	if want := []string{"/" + name}; !slices.Equal(cfg.Config.Entrypoint, want) {
		t.Errorf("entrypoint %q, want %q", cfg.Config.Entrypoint, want)
	}
	if cfg.OS != "linux" || cfg.Architecture == "" {
		t.Errorf("platform %s/%s", cfg.OS, cfg.Architecture)
	}
	if cfg.Config.Labels["org.opencontainers.image.title"] != name {
		t.Errorf("title label %q, want %q", cfg.Config.Labels["org.opencontainers.image.title"], name)
	}
	f, ok := got.files["/"+name]
	if !ok {
		t.Fatalf("no /%s in the image; files: %v", name, slices.Sorted(maps.Keys(got.files)))
	}
	if f.hdr.Typeflag != tar.TypeReg || f.hdr.Mode != 0o755 {
		t.Errorf("/%s: type %c mode %o, want a regular file with mode 755", name, f.hdr.Typeflag, f.hdr.Mode)
	}
	want, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f.data, want) {
		t.Errorf("/%s differs from %s (%d bytes, want %d)", name, binary, len(f.data), len(want))
	}
	if p := got.files["/etc/passwd"]; !strings.Contains(string(p.data), ":65532:65532:") {
		t.Errorf("/etc/passwd names no user 65532: %q", p.data)
	}
	if tmp := got.files["/tmp"]; tmp.hdr == nil || tmp.hdr.Mode != 0o1777 {
		t.Error("no world-writable /tmp")
	}
}

// checkStatic fails unless the ELF executable needs no dynamic loader or
// shared library (CGO_ENABLED=0).
func checkStatic(t *testing.T, bin []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a dynamic loader (PT_INTERP): build it with CGO_ENABLED=0")
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		t.Errorf("the binary links shared libraries %v", libs)
	}
}

func untar(t *testing.T, path, dir string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("%s: entry %q leaves the archive", path, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var data []byte
			if data, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, data, 0o644)
			}
		default:
			t.Fatalf("%s: unexpected entry %q of type %c", path, h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
