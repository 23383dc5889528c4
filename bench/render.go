package bench

import "strings"

// Endpoint names the API a run drives.
type Endpoint string

const (
	Completions Endpoint = "completions" // POST /v1/completions
	Chat        Endpoint = "chat"        // POST /v1/chat/completions
)

// Path is the endpoint's URL path.
func (e Endpoint) Path() string {
	if e == Chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// PromptFormat says how synthetic prompts go on the wire.
type PromptFormat string

const (
	// IDs sends prompts as token ids (`"prompt": [ids]`, completions only):
	// the server sees exactly the intended number of tokens.
	IDs PromptFormat = "ids"
	// Text sends prompts as words from a fixed list, about one token each;
	// the server's usage reports the real length.
	Text PromptFormat = "text"
)

// words renders synthetic tokens as text: short common English words, each
// one token (with its leading space) in the usual BPE and SentencePiece
// vocabularies.
var words = strings.Fields(`the of and to in is it you that he was for on are
with as his they be at one have this from or had by not word but what some we
can out other were all there when up use your how said an each she which do
their time if will way about many then them write would like so these her long
make thing see him two has look more day could go come did number sound no most
people my over know water than call first who may down side been now find any
new work part take get place made live where after back little only round man
year came show every good me give our under name very through just form sentence
great think say help low line differ turn cause much mean before move right boy
old too same tell does set three want air well also play small end put home read
hand port large spell add even land here must big high such follow act why ask
men change went light kind off need house picture try us again animal point
mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between
state keep eye never last let thought city tree cross farm hard start might
story saw far sea draw left late run while press close night real life few
north open seem together next white children begin got walk example ease paper
group always music those both mark often letter until mile river car feet care
second book carry took science eat room friend began idea fish mountain stop
once base hear horse cut sure watch color face wood main enough plain girl usual
young ready above ever red list though feel talk bird soon body dog family
direct pose leave song measure door product black short numeral class wind
question happen complete ship area half rock order fire south problem piece told
knew pass since top whole king space heard best hour better true during hundred
five remember step early hold west ground interest reach fast verb sing listen
six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern
pull cold notice voice unit power town fine certain fly fall lead cry dark
machine note wait plan figure star box noun field rest correct able pound done
beauty drive stood contain front teach week final gave green oh quick develop
ocean warm free minute strong special mind behind clear tail produce fact street
inch multiply nothing course stay wheel full force blue object decide surface
deep moon island foot system busy test record boat common gold possible plane
stead dry wonder laugh thousand ago ran check game shape equate hot miss brought
heat snow tire bring yes distant fill east paint language among`)

// Renderer maps abstract tokens to the wire.
type Renderer struct {
	TokenIDs []int32 // token ids the server accepts (IDs format)
}

// IDs renders segments as token ids drawn from TokenIDs.
func (r *Renderer) IDs(segs []Segment) []int32 {
	var buf []uint32
	for _, s := range segs {
		buf = s.Tokens(buf)
	}
	out := make([]int32, len(buf))
	for i, t := range buf {
		out[i] = r.TokenIDs[int(t%uint32(len(r.TokenIDs)))]
	}
	return out
}

// Words is the word list RenderText draws from, one token each in the usual vocabularies.
func Words() []string { return words }

// RenderText renders segments as words, one word per token.
func RenderText(segs []Segment) string {
	var buf []uint32
	for _, s := range segs {
		buf = s.Tokens(buf)
	}
	var b strings.Builder
	for i, t := range buf {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[int(t%uint32(len(words)))])
	}
	return b.String()
}
