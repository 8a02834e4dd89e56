package hfhub

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Kind is a repository's type on the Hub.
type Kind string

// The kinds of repository memfit reads.
const (
	Model   Kind = "model"
	Dataset Kind = "dataset"
)

// DefaultRevision is the revision read when none is named.
const DefaultRevision = "main"

// Repo names a repository at a revision: ORG/NAME and a branch, tag or commit ("" is main).
type Repo struct {
	Kind     Kind
	ID       string
	Revision string
}

// Rev is the revision, main when none was named.
func (r Repo) Rev() string {
	if r.Revision == "" {
		return DefaultRevision
	}
	return r.Revision
}

// String is ORG/NAME, with @REVISION when one other than main was named.
func (r Repo) String() string {
	if r.Revision == "" || r.Revision == DefaultRevision {
		return r.ID
	}
	return r.ID + "@" + r.Revision
}

// describe is "model ORG/NAME" (with @REVISION), for messages.
func (r Repo) describe() string { return string(r.Kind) + " " + r.String() }

// folder is the repository's folder in the cache: models--ORG--NAME (huggingface_hub's repo_folder_name).
func (r Repo) folder() string {
	return string(r.Kind) + "s--" + strings.ReplaceAll(r.ID, "/", "--")
}

// urlPrefix is what comes before the id in the Hub's URLs: "" for models, "datasets/" for datasets.
func (r Repo) urlPrefix() string {
	if r.Kind == Model {
		return ""
	}
	return string(r.Kind) + "s/"
}

// idPart is huggingface_hub's REPO_ID_REGEX for one of the id's two parts (letters, digits, _ - ., starting and
// ending with a word character, at most 96), without "--" or "..".
var idPart = regexp.MustCompile(`^[\w][\w.-]{0,94}[\w]$|^[\w]$`)

// ValidID says whether id is ORG/NAME as the Hub accepts it.
func ValidID(id string) bool {
	org, name, ok := strings.Cut(id, "/")
	if !ok || strings.Contains(name, "/") {
		return false
	}
	for _, p := range []string{org, name} {
		if !idPart.MatchString(p) || strings.Contains(p, "--") || strings.Contains(p, "..") {
			return false
		}
	}
	return !strings.HasSuffix(name, ".git")
}

// ParseModel parses a model named as the Hub names it: ORG/NAME, ORG/NAME@REVISION, or the same behind hf:// or
// hf://models/ (huggingface_hub's HfFileSystem spelling). ok is false for anything else (a local path such as
// ./model, /abs/model or a/b/c, a preset name); an hf:// name that does not parse is an error.
func ParseModel(s string) (r Repo, ok bool, err error) {
	rest, isURL := strings.CutPrefix(s, "hf://")
	if isURL {
		rest = strings.TrimPrefix(rest, "models/")
		if strings.HasPrefix(rest, "datasets/") || strings.HasPrefix(rest, "spaces/") {
			return Repo{}, false, fmt.Errorf("%s is not a model repository (hf://ORG/NAME or hf://models/ORG/NAME)", s)
		}
	}
	id, rev, path, err := splitRef(rest)
	if err == nil && path != "" {
		err = fmt.Errorf("a model is a whole repository: drop /%s", path)
	}
	if err != nil || !ValidID(id) {
		if isURL {
			if err == nil {
				err = fmt.Errorf("%q is not a repository id ORG/NAME", id)
			}
			return Repo{}, false, fmt.Errorf("%s: %v", s, err)
		}
		return Repo{}, false, nil
	}
	return Repo{Kind: Model, ID: id, Revision: rev}, true, nil
}

// DataRef is a dataset named by its Hub URL: the repository, and a file or folder in it ("" for all of it).
type DataRef struct {
	Repo
	Path string
}

// String is the hf:// URL.
func (d DataRef) String() string {
	s := "hf://datasets/" + d.Repo.String()
	if d.Path != "" {
		s += "/" + d.Path
	}
	return s
}

// IsDataURL says whether s is spelled as a Hub dataset URL (hf://datasets/...).
func IsDataURL(s string) bool { return strings.HasPrefix(s, "hf://") }

// ParseData parses hf://datasets/ORG/NAME[@REVISION][/PATH], the spelling of huggingface_hub's HfFileSystem,
// DuckDB and pandas. A revision holding a slash is written refs/pr/N, refs/convert/parquet, or with %2F.
func ParseData(s string) (DataRef, error) {
	rest, ok := strings.CutPrefix(s, "hf://datasets/")
	if !ok {
		return DataRef{}, fmt.Errorf("%s: a Hub dataset is hf://datasets/ORG/NAME[@REVISION][/PATH]", s)
	}
	id, rev, path, err := splitRef(rest)
	if err == nil && !ValidID(id) {
		err = fmt.Errorf("%q is not a repository id ORG/NAME", id)
	}
	if err != nil {
		return DataRef{}, fmt.Errorf("%s: %v", s, err)
	}
	return DataRef{Repo: Repo{Kind: Dataset, ID: id, Revision: rev}, Path: path}, nil
}

// specialRev matches the revisions with slashes HfFileSystem recognises after @.
var specialRev = regexp.MustCompile(`^refs/(convert/[\w-]+|pr/\d+)`)

// splitRef splits ORG/NAME[@REV][/PATH].
func splitRef(s string) (id, rev, path string, err error) {
	org, rest, _ := strings.Cut(s, "/")
	name, rest, hasMore := strings.Cut(rest, "/")
	if n, r, hasRev := strings.Cut(name, "@"); hasRev {
		name = n
		if m := specialRev.FindString(r + "/" + rest); hasMore && strings.HasPrefix(r, "refs") && m != "" {
			r, rest = m, strings.TrimPrefix(strings.TrimPrefix(r+"/"+rest, m), "/")
			hasMore = rest != ""
		}
		if rev, err = url.PathUnescape(r); err != nil || rev == "" {
			return "", "", "", fmt.Errorf("bad revision %q after @", r)
		}
	}
	id = org + "/" + name
	if hasMore {
		path = strings.Trim(rest, "/")
		for _, p := range strings.Split(path, "/") {
			if p == ".." || p == "." {
				return "", "", "", fmt.Errorf("path %q: no . or .. parts", path)
			}
		}
	}
	return id, rev, path, nil
}
