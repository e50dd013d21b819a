// Command mkimage writes a directory as a one-layer OCI image archive (an
// OCI image layout in a tar) that `ctr images import` loads, so that the
// local node runs images built here without Docker or a registry.
//
//	go run ./hack/mkimage --rootfs DIR --tag NAME[,NAME...] --out FILE.tar \
//	    [--entrypoint JSON] [--cmd JSON] [--user UID:GID] [--workdir DIR] \
//	    [--env K=V]... [--owners FILE] [--epoch SECONDS]
//
// The archive is reproducible: entries are in lexical order, every mtime is
// the epoch, and owners are 0:0 unless --owners names them, so the same
// rootfs always gives the same bytes (and the same image digest).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

// multiFlag collects a repeatable flag; commas also separate values when
// split is set (tags may be given as one list).
type multiFlag struct {
	values []string
	split  bool
}

func (m *multiFlag) String() string { return strings.Join(m.values, ",") }

func (m *multiFlag) Set(v string) error {
	if !m.split {
		m.values = append(m.values, v)
		return nil
	}
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			m.values = append(m.values, s)
		}
	}
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	var (
		opts       Options
		tags       = multiFlag{split: true}
		env        multiFlag
		entrypoint = fs.String("entrypoint", "", `the entrypoint as a JSON array, e.g. '["/usr/bin/kubefill"]'; empty for none`)
		cmd        = fs.String("cmd", "", `the default arguments (Cmd) as a JSON array; empty for none`)
		owners     = fs.String("owners", "", "a file of `PATH UID:GID` lines giving those paths an owner other than 0:0")
	)
	fs.StringVar(&opts.Rootfs, "rootfs", "", "the directory that becomes the image's filesystem")
	fs.Var(&tags, "tag", "an image name; repeat or separate with commas (busybox:1.36 means docker.io/library/busybox:1.36)")
	fs.StringVar(&opts.User, "user", "", "the user the image runs as (UID[:GID])")
	fs.StringVar(&opts.WorkingDir, "workdir", "", "the working directory")
	fs.Var(&env, "env", "an environment variable K=V; repeatable")
	fs.Int64Var(&opts.Epoch, "epoch", 0, "the time stamp of every file and of the image, in seconds since 1970")
	out := fs.String("out", "", "the archive to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if opts.Rootfs == "" || *out == "" || len(tags.values) == 0 {
		return errors.New("--rootfs, --tag and --out are required")
	}
	var err error
	if opts.Entrypoint, err = parseArgv("--entrypoint", *entrypoint); err != nil {
		return err
	}
	if opts.Cmd, err = parseArgv("--cmd", *cmd); err != nil {
		return err
	}
	for _, kv := range env.values {
		if !strings.Contains(kv, "=") || strings.HasPrefix(kv, "=") {
			return fmt.Errorf("--env %q: want K=V", kv)
		}
	}
	opts.Env = env.values
	for _, t := range tags.values {
		name, err := NormalizeName(t)
		if err != nil {
			return err
		}
		opts.Names = append(opts.Names, name)
	}
	if *owners != "" {
		if opts.Owners, err = readOwners(*owners); err != nil {
			return err
		}
	}
	res, err := WriteFile(*out, opts)
	if err != nil {
		return err
	}
	fmt.Printf("%s: manifest %s, layer %d bytes (%d uncompressed), %s\n",
		*out, res.Manifest.Digest, res.Layer.Size, res.LayerUncompressed, strings.Join(opts.Names, " "))
	return nil
}
